//! FUSE mounts owned by the daemon.
//!
//! A filesystem dataset is mounted either because its `mountpoint`
//! property names a path ("automatic": the daemon mounts it when the pool
//! comes up and follows changes of the property) or because someone ran
//! `tarn mount` ("manual"). Every mount holds one `Fs` over one dataset:
//! the POSIX layer keeps open-file counts in memory, so a dataset is never
//! mounted twice. Anything that replaces a dataset's tree under a mount
//! (rollback) or removes it (destroy, export) unmounts it first; a busy
//! mount makes that operation fail instead of pulling files from under a
//! program. Rollback and rename mount again afterwards.
//!
//! *Service* mounts are the daemon's own: a dataset that Samba shares is
//! mounted for smbd in the state directory (Samba serves files through the
//! kernel, as the logged-in user). They are keyed by share name, share the
//! dataset's one `Fs` with every other front end (a second FUSE mount of
//! one `Fs` is coherent: each mount hears of the other's changes through
//! the `Fs`'s notifications), are not listed by `tarn mount list`, and are
//! taken down with everything else an operation unmounts. A busy service
//! mount first has its share's clients disconnected (the closer that the
//! SMB supervisor installs), because a connected SMB client always holds
//! its share open. `Pools::refresh_servers` mounts them again afterwards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tarn_api::dataset::MountInfo;
use tarn_api::ApiError;
use tarn_fuse::{Mount, MountOptions};
use tarn_pool::Pool;

use crate::convert::fuse_error;
use crate::filesystems::{covers, Filesystems};

struct Entry {
    info: MountInfo,
    mount: Mount,
}

/// A mount made for a front end (Samba), by share name.
struct ServiceEntry {
    dataset: String,
    path: PathBuf,
    fs: Arc<crate::filesystems::DatasetFs>,
    mount: Mount,
}

/// Makes the folder a service mount goes on: mode 000, so that while
/// nothing is mounted on it (between an unmount and the next refresh)
/// Samba's users are refused instead of shown an empty share; a dead mount
/// a killed daemon left there is detached first.
fn prepare_service_mountpoint(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::metadata(path) {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    std::fs::create_dir_all(path)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o000)))
        .map_err(|e| format!("cannot create {}: {e}", path.display()))
}

/// Disconnects the clients of one share so its mount can go.
pub type Closer = Box<dyn Fn(&str) + Send + Sync>;

/// What a service mount should serve: (share, dataset, its `Fs`, where).
pub struct ServiceWant {
    /// Share name (the key).
    pub share: String,
    /// The dataset.
    pub dataset: String,
    /// The dataset's shared filesystem object.
    pub fs: Arc<crate::filesystems::DatasetFs>,
    /// The mountpoint.
    pub path: PathBuf,
}

/// The daemon's mounts, by dataset name.
pub struct Mounts {
    inner: Mutex<BTreeMap<String, Entry>>,
    /// Service mounts, by share name.
    service: Mutex<BTreeMap<String, ServiceEntry>>,
    /// Disconnects a share's clients before its service mount goes.
    closer: Mutex<Option<Closer>>,
    /// Threads serving each mount.
    threads: usize,
}

impl Mounts {
    /// No mounts yet; each one will be served by `threads` threads.
    pub fn new(threads: usize) -> Mounts {
        Mounts {
            inner: Mutex::new(BTreeMap::new()),
            service: Mutex::new(BTreeMap::new()),
            closer: Mutex::new(None),
            threads,
        }
    }

    fn service_lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ServiceEntry>> {
        self.service.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs what disconnects a share's clients (the SMB supervisor).
    pub fn set_closer(&self, closer: Option<Closer>) {
        *self.closer.lock().unwrap_or_else(|e| e.into_inner()) = closer;
    }

    /// Makes the service mounts what `wanted` says: mounts what is
    /// missing, takes down what is no longer wanted or serves another
    /// `Fs` (a rollback or rename opened a fresh one) or path. Returns, per
    /// wanted share, an error for those that could not be mounted.
    pub fn sync_service(&self, wanted: Vec<ServiceWant>) -> Vec<(String, String)> {
        let stale: Vec<String> = self
            .service_lock()
            .iter()
            .filter(|(share, e)| {
                !wanted
                    .iter()
                    .any(|w| &w.share == *share && Arc::ptr_eq(&w.fs, &e.fs) && w.path == e.path)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut problems = Vec::new();
        for share in stale {
            if let Err(e) = self.service_unmount(&share) {
                log::warn!("tarn: cannot unmount the SMB mount of share '{share}': {e}");
                // Still mounted on what it served before (another dataset,
                // or a tree since rolled back or renamed): not served at
                // all rather than served from that, until it comes down.
                if wanted.iter().any(|w| w.share == share) {
                    problems.push((
                        share,
                        format!(
                            "its previous mount is still in use ({}); retried at the next change",
                            e.message
                        ),
                    ));
                }
            }
        }
        for w in wanted {
            if self.service_lock().contains_key(&w.share) {
                continue;
            }
            let opts = MountOptions {
                allow_other: true,
                fsname: w.dataset.replace(',', "_"),
                threads: self.threads,
                snapshot_time_names: true,
                ..Default::default()
            };
            let mounted = prepare_service_mountpoint(&w.path).and_then(|()| {
                tarn_fuse::mount(w.fs.clone(), &w.path, &opts).map_err(|e| e.to_string())
            });
            match mounted {
                Ok(mount) => {
                    self.service_lock().insert(
                        w.share.clone(),
                        ServiceEntry {
                            dataset: w.dataset,
                            path: w.path,
                            fs: w.fs,
                            mount,
                        },
                    );
                }
                Err(e) => problems.push((w.share, e)),
            }
        }
        problems
    }

    /// Takes down the service mount of `share`: if busy, disconnects the
    /// share's clients and tries again for a few seconds.
    fn service_unmount(&self, share: &str) -> Result<(), ApiError> {
        let Some(mut e) = self.service_lock().remove(share) else {
            return Ok(());
        };
        let mut closed = false;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match e.mount.unmount() {
                Ok(()) => return Ok(()),
                Err(err) if std::time::Instant::now() >= deadline => {
                    let api = fuse_error(err);
                    self.service_lock().insert(share.to_string(), e);
                    return Err(ApiError::busy(format!(
                        "share '{share}' is in use over SMB: {api}"
                    )));
                }
                Err(_) => {
                    if !closed {
                        if let Some(c) = &*self.closer.lock().unwrap_or_else(|e| e.into_inner()) {
                            c(share);
                        }
                        closed = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
    }

    /// Takes down the service mounts of `dataset` and everything below.
    fn service_unmount_tree(&self, dataset: &str) -> Result<(), ApiError> {
        let shares: Vec<String> = self
            .service_lock()
            .iter()
            .filter(|(_, e)| covers(dataset, &e.dataset))
            .map(|(k, _)| k.clone())
            .collect();
        for s in shares {
            self.service_unmount(&s)?;
        }
        Ok(())
    }

    /// Takes down the service mounts of exactly these datasets (not their
    /// children): what `tarn key unload` does before the key goes.
    pub fn service_unmount_datasets(&self, datasets: &[String]) -> Result<(), ApiError> {
        let shares: Vec<String> = self
            .service_lock()
            .iter()
            .filter(|(_, e)| datasets.contains(&e.dataset))
            .map(|(k, _)| k.clone())
            .collect();
        for s in shares {
            self.service_unmount(&s)?;
        }
        Ok(())
    }

    /// Every service mount, lazily (daemon shutdown, pool export).
    fn service_drop(&self, pool: Option<&str>) {
        let gone: Vec<ServiceEntry> = {
            let mut m = self.service_lock();
            let keys: Vec<String> = m
                .iter()
                .filter(|(_, e)| pool.is_none_or(|p| covers(p, &e.dataset)))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| m.remove(k)).collect()
        };
        drop(gone);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mounts `dataset` of `pool` at `path`, with the dataset's shared
    /// filesystem object from `fss`.
    #[allow(clippy::too_many_arguments)]
    pub fn mount(
        &self,
        fss: &Filesystems,
        pool: &Arc<Pool>,
        dataset: &str,
        path: &Path,
        manual: bool,
        allow_other: bool,
        read_only: bool,
    ) -> Result<MountInfo, ApiError> {
        let mut mounts = self.lock();
        if let Some(e) = mounts.get(dataset) {
            return Err(ApiError::exists(format!(
                "{dataset} is already mounted at {}",
                e.info.mountpoint
            )));
        }
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if let Some((other, _)) = mounts
            .iter()
            .find(|(_, e)| Path::new(&e.info.mountpoint) == canonical)
        {
            return Err(ApiError::exists(format!(
                "{} already has {other} mounted on it",
                canonical.display()
            )));
        }
        let fs = fss.get(pool, dataset)?;
        let opts = MountOptions {
            allow_other,
            read_only,
            fsname: dataset.replace(',', "_"),
            threads: self.threads,
            ..Default::default()
        };
        let mount = tarn_fuse::mount(fs, &canonical, &opts).map_err(fuse_error)?;
        let info = MountInfo {
            dataset: dataset.to_string(),
            mountpoint: canonical.display().to_string(),
            manual,
            allow_other,
            read_only,
        };
        mounts.insert(
            dataset.to_string(),
            Entry {
                info: info.clone(),
                mount,
            },
        );
        Ok(info)
    }

    /// Unmounts a dataset (given by name or by mountpoint path).
    pub fn unmount(&self, what: &str) -> Result<MountInfo, ApiError> {
        let mut mounts = self.lock();
        let key = if mounts.contains_key(what) {
            what.to_string()
        } else {
            let p = Path::new(what)
                .canonicalize()
                .unwrap_or_else(|_| PathBuf::from(what));
            mounts
                .iter()
                .find(|(_, e)| Path::new(&e.info.mountpoint) == p)
                .map(|(k, _)| k.clone())
                .ok_or_else(|| ApiError::not_found(format!("{what} is not mounted by tarn")))?
        };
        let Some(mut e) = mounts.remove(&key) else {
            return Err(ApiError::not_found(format!(
                "{what} is not mounted by tarn"
            )));
        };
        match e.mount.unmount() {
            Ok(()) => Ok(e.info),
            Err(err) => {
                let api = fuse_error(err);
                mounts.insert(key, e);
                Err(api)
            }
        }
    }

    /// The datasets mounted at or below `dataset`, parents before children.
    fn mounted_under(&self, dataset: &str) -> Vec<String> {
        self.lock()
            .keys()
            .filter(|k| covers(dataset, k))
            .cloned()
            .collect()
    }

    /// Unmounts `dataset` and everything below it; fails (leaving the rest
    /// mounted) if one of them is busy. Returns what was unmounted.
    pub fn unmount_tree(&self, dataset: &str) -> Result<Vec<MountInfo>, ApiError> {
        self.service_unmount_tree(dataset)?;
        let names = self.mounted_under(dataset);
        let mut done = Vec::new();
        for n in names.iter().rev() {
            done.push(self.unmount(n)?);
        }
        Ok(done)
    }

    /// [`Mounts::unmount_tree`], all or nothing: when one is busy, what was
    /// already unmounted is mounted again (manual mounts where they were,
    /// property mounts through `automount`) before the error is returned.
    pub fn unmount_tree_or_none(
        &self,
        fss: &Filesystems,
        pool: &Arc<Pool>,
        dataset: &str,
    ) -> Result<Vec<MountInfo>, ApiError> {
        // The mounts people use first, before anything is done to the
        // file sharing servers' own mounts (taking those down disconnects
        // their clients).
        let names = self.mounted_under(dataset);
        let mut done = Vec::new();
        for n in names.iter().rev() {
            match self.unmount(n) {
                Ok(info) => done.push(info),
                Err(e) => {
                    self.remount(fss, pool, done, None);
                    self.automount(fss, pool);
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.service_unmount_tree(dataset) {
            self.remount(fss, pool, done, None);
            self.automount(fss, pool);
            return Err(e);
        }
        Ok(done)
    }

    /// Mounts again what [`Mounts::unmount_tree`] took down, where it was
    /// (best effort; failures are reported on stderr).
    pub fn remount(
        &self,
        fss: &Filesystems,
        pool: &Arc<Pool>,
        infos: Vec<MountInfo>,
        rename: Option<(&str, &str)>,
    ) {
        for i in infos.into_iter().rev() {
            if !i.manual {
                continue; // property mounts come back through `automount`
            }
            let name = match rename {
                Some((old, new)) if covers(old, &i.dataset) => {
                    format!("{new}{}", &i.dataset[old.len()..])
                }
                _ => i.dataset.clone(),
            };
            let path = PathBuf::from(&i.mountpoint);
            if let Err(e) = self.mount(fss, pool, &name, &path, true, i.allow_other, i.read_only) {
                log::warn!("tarn: cannot mount {name} again at {}: {e}", i.mountpoint);
            }
        }
    }

    /// Unmounts everything of `pool` (lazily if busy: the pool is going).
    pub fn unmount_pool(&self, pool: &str) {
        self.service_drop(Some(pool));
        let mut mounts = self.lock();
        let names: Vec<String> = mounts.keys().filter(|k| covers(pool, k)).cloned().collect();
        for n in names {
            if let Some(mut e) = mounts.remove(&n) {
                if e.mount.unmount().is_err() {
                    // Dropping detaches it lazily.
                    log::warn!(
                        "tarn: {} was busy; detached it from {}",
                        e.info.dataset,
                        e.info.mountpoint
                    );
                }
            }
        }
    }

    /// Makes the property mounts of `pool` match its `mountpoint`
    /// properties: mounts what names a path, unmounts what no longer does
    /// (manual mounts are left alone). Failures are reported on stderr.
    pub fn automount(&self, fss: &Filesystems, pool: &Arc<Pool>) {
        let Ok(list) = tarn_dataset::list(pool, false) else {
            return;
        };
        let wanted: BTreeMap<String, PathBuf> = list
            .into_iter()
            .filter_map(|d| {
                let mp = d.mountpoint?;
                mp.starts_with('/').then(|| (d.name, PathBuf::from(mp)))
            })
            .collect();
        let stale: Vec<String> = self
            .lock()
            .iter()
            .filter(|(name, e)| {
                !e.info.manual
                    && covers(pool.name(), name)
                    && wanted
                        .get(*name)
                        .is_none_or(|p| Path::new(&e.info.mountpoint) != p.as_path())
            })
            .map(|(n, _)| n.clone())
            .collect();
        for n in stale {
            if let Err(e) = self.unmount(&n) {
                log::warn!("tarn: cannot unmount {n}: {e}");
            }
        }
        // Parents before children, so a child's folder is inside the mount.
        for (name, path) in wanted {
            if self.lock().contains_key(&name) {
                continue;
            }
            if let Err(e) = std::fs::create_dir_all(&path) {
                log::warn!("tarn: cannot create mountpoint {}: {e}", path.display());
                continue;
            }
            if let Err(e) = self.mount(fss, pool, &name, &path, false, false, false) {
                log::warn!("tarn: cannot mount {name} at {}: {e}", path.display());
            }
        }
    }

    /// Every mount.
    pub fn list(&self) -> Vec<MountInfo> {
        self.lock().values().map(|e| e.info.clone()).collect()
    }

    /// Unmounts everything (daemon shutdown).
    pub fn unmount_all(&self) {
        self.service_drop(None);
        let mut mounts = self.lock();
        for (_, mut e) in std::mem::take(&mut *mounts).into_iter().rev() {
            if e.mount.unmount().is_err() {
                log::warn!(
                    "tarn: {} was busy; detached it from {}",
                    e.info.dataset,
                    e.info.mountpoint
                );
            }
        }
    }
}
