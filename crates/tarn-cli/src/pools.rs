//! The real backend: the daemon's set of imported pools.
//!
//! The daemon keeps two small files in its state directory:
//!
//! - `daemon-id`: a random identity written on first start. It is recorded as
//!   the owner in the labels of every pool this daemon imports, so after a
//!   crash the same daemon may take its pools back without `--force`, while
//!   another daemon (or host) is asked for `--force`.
//! - `pools.json`: the pools to import at start (name, GUID, device paths),
//!   rewritten atomically (temp file + rename) whenever the set changes.
//!
//! Pool operations run on the calling connection's thread; the pool layer
//! does its own locking, so requests to different pools never wait for each
//! other and a failing pool never blocks the others.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tarn_dataset::{DatasetInfo, DsError, PropValue};
use tarn_pool::status::{IostatEntry, PoolListEntry, PoolStatus, ScanStatus};
use tarn_pool::{Pool, PoolError, PoolOptions, ScanAction};
use tarn_vdev::VdevKind as PoolVdevKind;

use crate::access::{self, Share, UserInfo};
use crate::api::ShareInfo;
use crate::api::{ApiError, ErrorCode};
use crate::backend::{
    Backend, CreateRequest, ImportRequest, ImportResult, ObjectInfo, ScrubAction, VdevKind,
    VdevSpec,
};
use crate::daemon::Tuning;
use crate::filesystems::Filesystems;
use crate::mounts::{MountInfo, Mounts};
use crate::servers::{share_entries, Endpoints, ServerOptions, Servers};

/// Bytes moved per call between an object and a file.
const COPY_CHUNK_BYTES: usize = 8 << 20;

/// One pool the daemon imports at start.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CacheEntry {
    name: String,
    guid: String,
    devices: Vec<PathBuf>,
}

/// Every imported pool of this daemon.
pub struct Pools {
    state_dir: PathBuf,
    opts: PoolOptions,
    pools: Mutex<BTreeMap<String, Arc<Pool>>>,
    /// Names being created or imported right now (lock order: `pools`
    /// first, then `pending`).
    pending: Mutex<BTreeSet<String>>,
    /// Cached pools that could not be imported at start: kept in the cache
    /// and listed as UNAVAIL until they are imported or destroyed.
    unavailable: Mutex<Vec<CacheEntry>>,
    /// Serializes rewrites of `pools.json`.
    cache_lock: Mutex<()>,
    /// Exclusive lock on the state directory: one daemon per state.
    _state_lock: std::fs::File,
    /// FUSE mounts of datasets.
    mounts: Mounts,
    /// The one filesystem object of each dataset in use.
    fss: Filesystems,
    /// NFS and WebDAV.
    servers: Servers,
}

/// A pool name reserved while a create or import runs.
struct NameGuard<'a> {
    pools: &'a Pools,
    name: String,
}

impl Drop for NameGuard<'_> {
    fn drop(&mut self) {
        self.pools
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.name);
    }
}

/// Maps a pool-layer error onto an API error code.
pub fn api_error(e: PoolError) -> ApiError {
    let code = match &e {
        PoolError::NotFound(_) => ErrorCode::NotFound,
        PoolError::Exists(_) => ErrorCode::Exists,
        PoolError::InUse(_) => ErrorCode::Busy,
        PoolError::Invalid(_) | PoolError::NoSpace(_) => ErrorCode::Invalid,
        PoolError::Damaged(_) | PoolError::Corrupt(_) => ErrorCode::Damaged,
        PoolError::Device(_) | PoolError::Block(_) | PoolError::Faulted(_) => ErrorCode::Io,
        _ => ErrorCode::Internal,
    };
    ApiError::new(code, e.to_string())
}

/// Maps the error of an operation on the imported pool `pool`. The message
/// names the pool when it does not already (one daemon serves many), and a
/// faulted pool's says how it comes back.
fn in_pool(pool: &str) -> impl Fn(PoolError) -> ApiError + '_ {
    move |e| match e {
        PoolError::Faulted(why) => ApiError::io(format!(
            "pool '{pool}' is faulted: {why}; \
             fix or reattach its devices, then export and import it"
        )),
        other => {
            let mut a = api_error(other);
            if !a.message.contains(&format!("'{pool}'")) {
                a.message = format!("pool '{pool}': {}", a.message);
            }
            a
        }
    }
}

/// Loads a pool's datasets; a failure leaves the pool usable at the pool
/// level and is reported, and dataset commands then say why they fail.
fn attach_datasets(pool: &Arc<Pool>) {
    if let Err(e) = tarn_dataset::attach(pool) {
        eprintln!(
            "tarn: pool '{}': cannot load its datasets: {e}",
            pool.name()
        );
    }
}

/// Maps dataset-layer errors onto the API's codes.
pub fn ds_error(e: DsError) -> ApiError {
    match e {
        DsError::NotFound(m) => ApiError::not_found(m),
        DsError::Exists(m) => ApiError::exists(m),
        DsError::Busy(m) => ApiError::busy(m),
        DsError::Damaged(_) | DsError::Corrupt(_) => ApiError::damaged(e.to_string()),
        DsError::Pool(p) => api_error(p),
        other => ApiError::invalid(other.to_string()),
    }
}

/// The pool part of a dataset name (`tank` of `tank/a@s`).
fn pool_of(name: &str) -> &str {
    name.split(['/', '@']).next().unwrap_or(name)
}

fn io_error(what: &str, path: &str, e: std::io::Error) -> ApiError {
    ApiError::io(format!("{what} {path}: {e}"))
}

impl Pools {
    /// Opens (creating) the state directory and imports the pools the
    /// daemon owned when it last ran. A pool that cannot be imported is
    /// reported on stderr and skipped; the others still come up.
    pub fn open(state_dir: &Path, tuning: &Tuning) -> anyhow::Result<Pools> {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot create state directory {}: {e}; choose another with --state-dir",
                state_dir.display()
            )
        })?;
        let state_lock = std::fs::File::create(state_dir.join("lock"))?;
        if state_lock.try_lock().is_err() {
            anyhow::bail!(
                "another tarn daemon is using the state directory {}; stop it first or pass another --state-dir",
                state_dir.display()
            );
        }
        let id_path = state_dir.join("daemon-id");
        let id = match std::fs::read_to_string(&id_path) {
            Ok(s) if !s.trim().is_empty() => s.trim().to_string(),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                anyhow::bail!("cannot read {}: {e}", id_path.display())
            }
            _ => {
                let mut b = [0u8; 8];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut f| f.read_exact(&mut b))
                    .map_err(|e| anyhow::anyhow!("cannot read /dev/urandom: {e}"))?;
                let id = format!("{:016x}", u64::from_le_bytes(b));
                write_atomically(&id_path, id.as_bytes())?;
                id
            }
        };
        let dirty_max = tuning.dirty_max_mib << 20;
        // One block cache for every pool of the daemon.
        if tuning.cache_mib > 0 {
            tarn_block::BlockCache::global().set_max_bytes((tuning.cache_mib << 20) as usize);
        }
        let opts = PoolOptions {
            // The identity alone: a renamed host still owns its pools.
            owner: format!("tarn daemon {id}"),
            sync_interval: std::time::Duration::from_secs(tuning.txg_interval_secs.max(1)),
            dirty_max_bytes: dirty_max,
            dirty_sync_bytes: dirty_max / 4,
            ..Default::default()
        };
        let me = Pools {
            state_dir: state_dir.to_path_buf(),
            opts,
            pools: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(BTreeSet::new()),
            unavailable: Mutex::new(Vec::new()),
            cache_lock: Mutex::new(()),
            _state_lock: state_lock,
            mounts: Mounts::default(),
            fss: Filesystems::default(),
            servers: Servers::default(),
        };
        for entry in me.read_cache() {
            match Pool::import(
                &[],
                &entry.devices,
                &entry.guid,
                Some(&entry.name),
                false,
                me.opts.clone(),
            ) {
                Ok(pool) => {
                    attach_datasets(&pool);
                    eprintln!(
                        "tarn: imported pool '{}' (state {})",
                        entry.name,
                        pool.health()
                    );
                    me.mounts.automount(&me.fss, &pool);
                    me.lock().insert(entry.name.clone(), pool);
                }
                Err(e) => {
                    // Kept in the cache: disks may come late, or be fixed.
                    eprintln!("tarn: cannot import pool '{}': {e}", entry.name);
                    me.unavailable
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(entry.clone());
                }
            }
        }
        me.write_cache();
        Ok(me)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Pool>>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cache_path(&self) -> PathBuf {
        self.state_dir.join("pools.json")
    }

    fn read_cache(&self) -> Vec<CacheEntry> {
        match std::fs::read(self.cache_path()) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                eprintln!(
                    "tarn: ignoring unreadable {}: {e}",
                    self.cache_path().display()
                );
                Vec::new()
            }),
            Err(_) => Vec::new(),
        }
    }

    /// Rewrites the pool cache atomically; writers are serialized so the
    /// last state always wins.
    fn write_cache(&self) {
        let _serial = self.cache_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries: Vec<CacheEntry> = self
            .lock()
            .values()
            .map(|p| CacheEntry {
                name: p.name().to_string(),
                guid: format!("{:016x}", p.guid()),
                devices: p.device_paths(),
            })
            .collect();
        {
            let mut unavailable = self.unavailable.lock().unwrap_or_else(|e| e.into_inner());
            unavailable.retain(|u| !entries.iter().any(|e| e.guid == u.guid || e.name == u.name));
            entries.extend(unavailable.iter().cloned());
        }
        let result = serde_json::to_vec_pretty(&entries)
            .map_err(std::io::Error::other)
            .and_then(|b| write_atomically(&self.cache_path(), &b));
        if let Err(e) = result {
            eprintln!("tarn: cannot save {}: {e}", self.cache_path().display());
        }
    }

    /// Reserves `name` for a create or import; fails if it is taken.
    fn reserve(&self, name: &str) -> Result<NameGuard<'_>, ApiError> {
        let pools = self.lock();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pools.contains_key(name) || pending.contains(name) {
            return Err(ApiError::exists(format!(
                "a pool named '{name}' is already imported (or being imported); choose another name"
            )));
        }
        pending.insert(name.to_string());
        Ok(NameGuard {
            pools: self,
            name: name.to_string(),
        })
    }

    /// Removes `pool` from the set if it is still the one under its name.
    fn forget(&self, pool: &Arc<Pool>) {
        let mut pools = self.lock();
        if pools.get(pool.name()).is_some_and(|p| Arc::ptr_eq(p, pool)) {
            pools.remove(pool.name());
        }
    }

    /// Whether `path` is a device of an imported pool.
    fn is_pool_device(&self, path: &Path) -> bool {
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        self.lock()
            .values()
            .any(|p| p.device_paths().contains(&canon))
    }

    /// Every imported pool.
    pub fn all_pools(&self) -> Vec<Arc<Pool>> {
        self.lock().values().cloned().collect()
    }

    /// The NFS exports and WebDAV shares of every pool's stored shares.
    pub fn share_lists(&self) -> (Vec<tarn_nfs::Export>, Vec<tarn_webdav::Share>) {
        let mut exports = Vec::new();
        let mut shares = Vec::new();
        for pool in self.all_pools() {
            let list = match access::shares(&pool) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("tarn: pool '{}': cannot read its shares: {e}", pool.name());
                    continue;
                }
            };
            for share in list {
                let fs = match self.fss.get(&pool, &share.dataset) {
                    Ok(fs) => fs,
                    Err(e) => {
                        eprintln!("tarn: share '{}': {e}", share.name);
                        continue;
                    }
                };
                let (export, dav) = share_entries(fs, &share);
                exports.extend(export);
                shares.extend(dav);
            }
        }
        (exports, shares)
    }

    /// Starts NFS and WebDAV as the options say.
    pub fn start_servers(self: &Arc<Self>, opts: &ServerOptions) -> anyhow::Result<()> {
        self.servers.start(self, opts, &self.state_dir)
    }

    /// Gives the running servers the current shares (after any change of
    /// shares, pools or datasets).
    fn refresh_servers(&self) {
        let (exports, shares) = self.share_lists();
        self.servers.update(exports, shares);
    }

    /// The pool that stores users: the named one, or the only one.
    fn pool_for_users(&self, pool: Option<&str>) -> Result<Arc<Pool>, ApiError> {
        if let Some(p) = pool {
            return self.get(p);
        }
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        match pools.as_slice() {
            [p] => Ok(p.clone()),
            [] => Err(ApiError::not_found(
                "no pool is imported; users are stored in a pool",
            )),
            _ => Err(ApiError::invalid(
                "several pools are imported; say which stores the user with --pool",
            )),
        }
    }

    fn get(&self, name: &str) -> Result<Arc<Pool>, ApiError> {
        self.lock().get(name).cloned().ok_or_else(|| {
            ApiError::not_found(format!(
                "no pool '{name}' is imported; `tarn pool list` shows the pools, `tarn pool import` finds others"
            ))
        })
    }
}

fn kind(k: VdevKind) -> PoolVdevKind {
    match k {
        VdevKind::Single => PoolVdevKind::Single,
        VdevKind::Mirror => PoolVdevKind::Mirror,
        VdevKind::Raidz1 => PoolVdevKind::Raidz { parity: 1 },
        VdevKind::Raidz2 => PoolVdevKind::Raidz { parity: 2 },
        VdevKind::Raidz3 => PoolVdevKind::Raidz { parity: 3 },
    }
}

impl Backend for Pools {
    fn pool_create(&self, req: &CreateRequest) -> Result<PoolStatus, ApiError> {
        let _name = self.reserve(&req.name)?;
        let specs: Vec<tarn_pool::VdevSpec> = req
            .vdevs
            .iter()
            .map(|v| tarn_pool::VdevSpec {
                kind: kind(v.kind),
                devices: v.devices.iter().map(PathBuf::from).collect(),
            })
            .collect();
        let pool = Pool::create(
            &req.name,
            &specs,
            req.ashift.unwrap_or(12),
            &req.properties,
            req.force,
            self.opts.clone(),
        )
        .map_err(api_error)?;
        attach_datasets(&pool);
        self.mounts.automount(&self.fss, &pool);
        let status = pool.status();
        self.lock().insert(req.name.clone(), pool);
        self.write_cache();
        self.refresh_servers();
        Ok(status)
    }

    fn pool_import(&self, req: &ImportRequest) -> Result<ImportResult, ApiError> {
        let dirs: Vec<PathBuf> = req.dirs.iter().map(PathBuf::from).collect();
        let devices: Vec<PathBuf> = req.devices.iter().map(PathBuf::from).collect();
        let Some(which) = req.pool.as_deref() else {
            let imported: Vec<String> = self
                .lock()
                .values()
                .map(|p| format!("{:016x}", p.guid()))
                .collect();
            let found = tarn_pool::discover(&dirs, &devices)
                .into_iter()
                .filter(|c| !imported.contains(&c.guid))
                .collect();
            return Ok(ImportResult::Candidates(found));
        };
        // The name the pool will get is known up front unless it is imported
        // by GUID under its own name: then it is checked once known.
        let name = req.new_name.clone().unwrap_or_else(|| which.to_string());
        let _name = self.reserve(&name)?;
        let opts = PoolOptions {
            discard_log: req.discard_log,
            ..self.opts.clone()
        };
        let pool = Pool::import(
            &dirs,
            &devices,
            which,
            req.new_name.as_deref(),
            req.force,
            opts,
        )
        .map_err(api_error)?;
        attach_datasets(&pool);
        let status = pool.status();
        {
            let mut pools = self.lock();
            let taken = pools.contains_key(pool.name())
                || (pool.name() != name
                    && self
                        .pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(pool.name()));
            if taken {
                drop(pools);
                let _ = pool.export(false);
                return Err(ApiError::exists(format!(
                    "a pool named '{}' is already imported; give this one another name: `tarn pool import {which} NEWNAME`",
                    pool.name()
                )));
            }
            pools.insert(pool.name().to_string(), pool.clone());
        }
        self.write_cache();
        self.mounts.automount(&self.fss, &pool);
        self.refresh_servers();
        Ok(ImportResult::Imported(Box::new(status)))
    }

    fn pool_export(&self, name: &str, _force: bool) -> Result<(), ApiError> {
        let pool = self.get(name)?;
        self.mounts.unmount_pool(name);
        self.fss.forget_tree(name);
        let r = pool.export(false);
        self.forget(&pool);
        self.write_cache();
        self.refresh_servers();
        r.map_err(api_error)
    }

    fn pool_destroy(&self, name: &str, _force: bool) -> Result<(), ApiError> {
        let pool = self.get(name)?;
        self.mounts.unmount_pool(name);
        self.fss.forget_tree(name);
        let r = pool.export(true);
        self.forget(&pool);
        self.write_cache();
        self.refresh_servers();
        r.map_err(api_error)
    }

    fn pool_list(&self) -> Result<Vec<PoolListEntry>, ApiError> {
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        let mut out: Vec<PoolListEntry> = pools.iter().map(|p| p.list_entry()).collect();
        // Pools this daemon owns but could not import at start.
        for u in self
            .unavailable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            out.push(PoolListEntry {
                name: u.name.clone(),
                size: 0,
                allocated: 0,
                free: 0,
                health: tarn_pool::status::Health::Unavail,
                guid: u.guid.clone(),
            });
        }
        Ok(out)
    }

    fn pool_status(&self, name: Option<&str>) -> Result<Vec<PoolStatus>, ApiError> {
        match name {
            Some(n) => Ok(vec![self.get(n)?.status()]),
            None => {
                let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
                Ok(pools.iter().map(|p| p.status()).collect())
            }
        }
    }

    fn pool_scrub(&self, name: &str, action: ScrubAction) -> Result<Option<ScanStatus>, ApiError> {
        let a = match action {
            ScrubAction::Start => ScanAction::Start,
            ScrubAction::Pause => ScanAction::Pause,
            ScrubAction::Resume => ScanAction::Resume,
            ScrubAction::Cancel => ScanAction::Cancel,
        };
        self.get(name)?.scrub(a).map_err(in_pool(name))
    }

    fn pool_offline(&self, name: &str, device: &str) -> Result<(), ApiError> {
        self.get(name)?.offline(device).map_err(in_pool(name))
    }

    fn pool_online(&self, name: &str, device: &str) -> Result<(), ApiError> {
        self.get(name)?.online(device).map_err(in_pool(name))
    }

    fn pool_add_log(&self, name: &str, vdev: &VdevSpec, force: bool) -> Result<(), ApiError> {
        vdev.validate(0)?;
        let kind = match vdev.kind {
            crate::backend::VdevKind::Single => tarn_vdev::VdevKind::Single,
            crate::backend::VdevKind::Mirror => tarn_vdev::VdevKind::Mirror,
            _ => {
                return Err(ApiError::invalid(
                    "a log vdev is one device or a mirror, not raidz",
                ))
            }
        };
        let spec = tarn_pool::VdevSpec {
            kind,
            devices: vdev.devices.iter().map(PathBuf::from).collect(),
        };
        self.get(name)?.add_log(&spec, force).map_err(api_error)?;
        self.write_cache();
        Ok(())
    }

    fn pool_remove(&self, name: &str, device: &str) -> Result<(), ApiError> {
        self.get(name)?
            .remove_log(Path::new(device))
            .map_err(api_error)?;
        self.write_cache();
        Ok(())
    }

    fn pool_replace(&self, name: &str, old: &str, new: &str, force: bool) -> Result<(), ApiError> {
        let pool = self.get(name)?;
        pool.replace(old, Path::new(new), force)
            .map_err(in_pool(name))?;
        self.write_cache();
        Ok(())
    }

    fn pool_clear(&self, name: &str, device: Option<&str>) -> Result<(), ApiError> {
        self.get(name)?.clear(device).map_err(in_pool(name))
    }

    fn pool_iostat(&self, name: Option<&str>) -> Result<Vec<IostatEntry>, ApiError> {
        match name {
            Some(n) => Ok(self.get(n)?.iostat()),
            None => {
                let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
                Ok(pools.iter().flat_map(|p| p.iostat()).collect())
            }
        }
    }

    fn dataset_create(
        &self,
        name: &str,
        properties: &BTreeMap<String, String>,
        parents: bool,
    ) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        tarn_dataset::create(&pool, name, properties, parents).map_err(ds_error)?;
        self.mounts.automount(&self.fss, &pool);
        Ok(())
    }

    fn dataset_destroy(&self, name: &str, recursive: bool) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        // What goes away is unmounted first; a busy mount stops the destroy.
        let (fs, snap) = name.split_once('@').unwrap_or((name, ""));
        let gone = if snap.is_empty() {
            self.mounts.unmount_tree(fs)?
        } else {
            let mut gone = Vec::new();
            for m in self.mounts.list() {
                if m.dataset.starts_with(&format!("{fs}@")) {
                    gone.append(&mut self.mounts.unmount_tree(&m.dataset)?);
                }
            }
            gone
        };
        if snap.is_empty() {
            self.fss.forget_tree(fs);
        } else {
            self.fss.forget_snapshots(fs);
        }
        let r = tarn_dataset::destroy(&pool, name, recursive).map_err(ds_error);
        if r.is_err() {
            self.mounts.remount(&self.fss, &pool, gone, None);
            self.mounts.automount(&self.fss, &pool);
        }
        self.refresh_servers();
        r
    }

    fn dataset_list(&self, snapshots: bool) -> Result<Vec<DatasetInfo>, ApiError> {
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        let mut out = Vec::new();
        for p in pools {
            match tarn_dataset::list(&p, snapshots) {
                Ok(mut l) => out.append(&mut l),
                Err(e) => eprintln!("tarn: pool '{}': cannot list datasets: {e}", p.name()),
            }
        }
        Ok(out)
    }

    fn dataset_get(&self, name: &str, properties: &[String]) -> Result<Vec<PropValue>, ApiError> {
        let pool = self.get(pool_of(name))?;
        tarn_dataset::get_props(&pool, name, properties).map_err(ds_error)
    }

    fn dataset_set(&self, name: &str, property: &str, value: &str) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        tarn_dataset::set_prop(&pool, name, property, value).map_err(ds_error)?;
        if property == "mountpoint" {
            self.mounts.automount(&self.fss, &pool);
        }
        Ok(())
    }

    fn dataset_inherit(&self, name: &str, property: &str) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        tarn_dataset::inherit(&pool, name, property).map_err(ds_error)?;
        if property == "mountpoint" {
            self.mounts.automount(&self.fss, &pool);
        }
        Ok(())
    }

    fn dataset_rename(&self, name: &str, new_name: &str) -> Result<(), ApiError> {
        if pool_of(name) != pool_of(new_name) {
            return Err(ApiError::invalid(format!(
                "cannot rename '{name}' to '{new_name}': datasets stay in their pool"
            )));
        }
        let pool = self.get(pool_of(name))?;
        let fs = name.split('@').next().unwrap_or(name);
        let down = if name.contains('@') {
            self.mounts.unmount_tree(name)?
        } else {
            self.mounts.unmount_tree(fs)?
        };
        if name.contains('@') {
            self.fss.forget_tree(name);
        } else {
            self.fss.forget_tree(fs);
        }
        let r = tarn_dataset::rename(&pool, name, new_name).map_err(ds_error);
        let renamed = r.is_ok().then_some((name, new_name));
        self.mounts.remount(&self.fss, &pool, down, renamed);
        self.mounts.automount(&self.fss, &pool);
        self.refresh_servers();
        r
    }

    fn dataset_snapshot(&self, names: &[String], recursive: bool) -> Result<(), ApiError> {
        let first = pool_of(names.first().map(String::as_str).unwrap_or(""));
        if names.iter().any(|n| pool_of(n) != first) {
            return Err(ApiError::invalid(
                "snapshots taken together must be in one pool",
            ));
        }
        let pool = self.get(first)?;
        tarn_dataset::snapshot(&pool, names, recursive).map_err(ds_error)
    }

    fn dataset_rollback(&self, snapshot: &str, destroy_newer: bool) -> Result<(), ApiError> {
        let pool = self.get(pool_of(snapshot))?;
        // The tree changes under the filesystem: take its mount (and those
        // inside it) down and bring them back after.
        let fs = snapshot.split('@').next().unwrap_or(snapshot);
        let down = self.mounts.unmount_tree(fs)?;
        self.fss.forget_tree(fs);
        let r = tarn_dataset::rollback(&pool, snapshot, destroy_newer).map_err(ds_error);
        self.mounts.remount(&self.fss, &pool, down, None);
        self.mounts.automount(&self.fss, &pool);
        self.refresh_servers();
        r
    }

    fn dataset_clone(
        &self,
        snapshot: &str,
        name: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        if pool_of(snapshot) != pool_of(name) {
            return Err(ApiError::invalid(format!(
                "a clone lives in its origin's pool: '{name}' must start with '{}/'",
                pool_of(snapshot)
            )));
        }
        let pool = self.get(pool_of(name))?;
        tarn_dataset::clone(&pool, snapshot, name, properties).map_err(ds_error)?;
        self.mounts.automount(&self.fss, &pool);
        Ok(())
    }

    fn dataset_promote(&self, name: &str) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        // Snapshots of the origin's filesystem change names: unmount them.
        let origin = tarn_dataset::get_props(&pool, name, &["origin".to_string()])
            .map_err(ds_error)?
            .first()
            .map(|p| p.value.clone())
            .unwrap_or_default();
        if let Some((fs, _)) = origin.split_once('@') {
            for m in self.mounts.list() {
                if m.dataset.starts_with(&format!("{fs}@")) {
                    self.mounts.unmount(&m.dataset)?;
                }
            }
        }
        if let Some((fs, _)) = origin.split_once('@') {
            self.fss.forget_snapshots(fs);
        }
        let r = tarn_dataset::promote(&pool, name).map_err(ds_error);
        self.refresh_servers();
        r
    }

    fn pool_inject(
        &self,
        name: &str,
        device: &str,
        fault: Option<tarn_vdev::Fault>,
    ) -> Result<Vec<tarn_vdev::Fault>, ApiError> {
        let what = fault
            .as_ref()
            .map(|f| format!("{} ({:.0}%)", f.kind.name(), f.probability * 100.0))
            .unwrap_or_else(|| "no faults".into());
        let r = self
            .get(name)?
            .inject(device, fault)
            .map_err(in_pool(name))?;
        eprintln!("tarn: drill: pool '{name}' device {device}: {what}");
        Ok(r)
    }

    fn user_add(
        &self,
        pool: Option<&str>,
        name: &str,
        password: &str,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<UserInfo, ApiError> {
        let p = self.pool_for_users(pool)?;
        access::user_add(&p, name, password, uid, gid)
    }

    fn user_del(&self, pool: Option<&str>, name: &str) -> Result<(), ApiError> {
        let p = self.pool_for_users(pool)?;
        access::user_del(&p, name)
    }

    fn user_passwd(&self, pool: Option<&str>, name: &str, password: &str) -> Result<(), ApiError> {
        let p = self.pool_for_users(pool)?;
        access::user_passwd(&p, name, password)
    }

    fn user_list(&self) -> Result<Vec<UserInfo>, ApiError> {
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        let mut out = Vec::new();
        for p in pools {
            for u in access::users(&p)? {
                out.push(UserInfo {
                    pool: p.name().to_string(),
                    name: u.name,
                    uid: u.uid,
                    gid: u.gid,
                });
            }
        }
        Ok(out)
    }

    fn share_add(&self, share: &Share, owner: Option<&str>) -> Result<(), ApiError> {
        let pool = self.get(pool_of(&share.dataset))?;
        let owner = match owner {
            None => None,
            Some(name) => Some(
                access::users(&pool)?
                    .into_iter()
                    .find(|u| u.name == name)
                    .ok_or_else(|| {
                        ApiError::not_found(format!("no user '{name}' in pool '{}'", pool.name()))
                    })?,
            ),
        };
        access::share_put(&pool, share)?;
        if let Some(u) = owner {
            let fs = self.fss.get(&pool, &share.dataset)?;
            let sa = tarn_fs::SetAttr {
                uid: Some(u.uid),
                gid: Some(u.gid),
                ..Default::default()
            };
            fs.setattr(tarn_fs::ROOT_INO, &sa, &tarn_fs::Cred::root())
                .map_err(|e| {
                    ApiError::io(format!("cannot give {} to {}: {e}", share.dataset, u.name))
                })?;
        }
        self.refresh_servers();
        Ok(())
    }

    fn share_del(&self, pool: Option<&str>, name: &str) -> Result<(), ApiError> {
        let found: Vec<Arc<Pool>> = match pool {
            Some(p) => vec![self.get(p)?],
            None => {
                let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
                let mut hits = Vec::new();
                for p in pools {
                    if access::shares(&p)?.iter().any(|s| s.name == name) {
                        hits.push(p);
                    }
                }
                hits
            }
        };
        match found.as_slice() {
            [p] => {
                access::share_del(p, name)?;
                self.refresh_servers();
                Ok(())
            }
            [] => Err(ApiError::not_found(format!("no share '{name}'"))),
            _ => Err(ApiError::invalid(format!(
                "share '{name}' exists in several pools; name one with --pool"
            ))),
        }
    }

    fn share_list(&self) -> Result<Vec<ShareInfo>, ApiError> {
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        let mut out = Vec::new();
        for p in pools {
            for s in access::shares(&p)? {
                out.push(ShareInfo {
                    pool: p.name().to_string(),
                    share: s,
                });
            }
        }
        Ok(out)
    }

    fn dataset_mount(
        &self,
        name: &str,
        mountpoint: Option<&str>,
        allow_other: bool,
        read_only: bool,
    ) -> Result<MountInfo, ApiError> {
        let pool = self.get(pool_of(name))?;
        let path = match mountpoint {
            Some(p) => absolute_path(p)?.to_path_buf(),
            None => {
                let props = tarn_dataset::get_props(&pool, name, &["mountpoint".to_string()])
                    .map_err(ds_error)?;
                let mp = props.first().map(|p| p.value.clone()).unwrap_or_default();
                if !mp.starts_with('/') {
                    return Err(ApiError::invalid(format!(
                        "{name} has mountpoint={mp}; give a directory: `tarn mount {name} /mnt/dir`"
                    )));
                }
                PathBuf::from(mp)
            }
        };
        self.mounts
            .mount(&self.fss, &pool, name, &path, true, allow_other, read_only)
    }

    fn dataset_unmount(&self, name: &str) -> Result<(), ApiError> {
        self.mounts.unmount(name).map(|_| ())
    }

    fn dataset_mounts(&self) -> Result<Vec<MountInfo>, ApiError> {
        Ok(self.mounts.list())
    }

    fn endpoints(&self) -> Endpoints {
        self.servers.endpoints()
    }

    fn pool_sync(&self, name: &str) -> Result<u64, ApiError> {
        self.get(name)?.sync().map_err(in_pool(name))
    }

    fn object_write(
        &self,
        pool: &str,
        object: &str,
        from_path: &str,
        offset: u64,
        sync: bool,
    ) -> Result<ObjectInfo, ApiError> {
        let p = self.get(pool)?;
        let from = absolute_path(from_path)?;
        // Only regular files: a FIFO or terminal would hold this connection
        // forever, a device is not what anyone means to copy.
        match std::fs::metadata(from) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(ApiError::invalid(format!(
                    "{from_path} is not a regular file"
                )))
            }
            Err(e) => return Err(io_error("cannot open", from_path, e)),
        }
        let mut f = std::fs::File::open(from).map_err(|e| io_error("cannot open", from_path, e))?;
        let mut buf = vec![0u8; COPY_CHUNK_BYTES];
        let mut pos = offset;
        let mut info = None;
        loop {
            let n =
                read_full(&mut f, &mut buf).map_err(|e| io_error("cannot read", from_path, e))?;
            if n == 0 {
                break;
            }
            info = Some(
                p.object_write(object, pos, &buf[..n], false)
                    .map_err(in_pool(pool))?,
            );
            pos += n as u64;
        }
        let info = match info {
            Some(i) => i,
            // An empty file still creates the object.
            None => p
                .object_write(object, offset, &[], false)
                .map_err(in_pool(pool))?,
        };
        let txg = if sync {
            p.sync().map_err(in_pool(pool))?
        } else {
            info.txg
        };
        Ok(ObjectInfo {
            name: info.name,
            size: info.size,
            txg,
        })
    }

    fn object_read(&self, pool: &str, object: &str, to_path: &str) -> Result<ObjectInfo, ApiError> {
        let p = self.get(pool)?;
        let to = absolute_path(to_path)?;
        if self.is_pool_device(to) {
            return Err(ApiError::invalid(format!(
                "{to_path} is a device of an imported pool"
            )));
        }
        let info = p.object_info(object).map_err(in_pool(pool))?;
        // /dev/null for benchmarks; otherwise a regular file, written under a
        // temporary name and renamed into place only when complete, so an
        // error never leaves the destination destroyed or half written.
        let discard = to == Path::new("/dev/null");
        if !discard {
            if let Ok(m) = std::fs::symlink_metadata(to) {
                if !m.is_file() {
                    return Err(ApiError::invalid(format!(
                        "{to_path} exists and is not a regular file"
                    )));
                }
            }
        }
        let tmp = if discard {
            to.to_path_buf()
        } else {
            let file = to
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            to.with_file_name(format!(
                ".{file}.tarn-{}-{}",
                std::process::id(),
                next_tmp()
            ))
        };
        let result = (|| {
            let mut f = if discard {
                std::fs::OpenOptions::new().write(true).open(&tmp)
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
            }
            .map_err(|e| io_error("cannot create", to_path, e))?;
            let mut pos = 0u64;
            while pos < info.size {
                let n = ((info.size - pos) as usize).min(COPY_CHUNK_BYTES);
                let data = p.object_read(object, pos, n).map_err(in_pool(pool))?;
                if data.is_empty() {
                    break;
                }
                f.write_all(&data)
                    .map_err(|e| io_error("cannot write", to_path, e))?;
                pos += data.len() as u64;
            }
            if !discard {
                f.sync_all()
                    .map_err(|e| io_error("cannot write", to_path, e))?;
                std::fs::rename(&tmp, to).map_err(|e| io_error("cannot write", to_path, e))?;
            }
            Ok(())
        })();
        if result.is_err() && !discard {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        Ok(ObjectInfo {
            name: info.name,
            size: info.size,
            txg: info.txg,
        })
    }

    fn object_list(&self, pool: &str) -> Result<Vec<ObjectInfo>, ApiError> {
        let list = self.get(pool)?.object_list().map_err(in_pool(pool))?;
        Ok(list
            .into_iter()
            .map(|o| ObjectInfo {
                name: o.name,
                size: o.size,
                txg: o.txg,
            })
            .collect())
    }

    fn object_delete(&self, pool: &str, object: &str) -> Result<(), ApiError> {
        self.get(pool)?.object_delete(object).map_err(in_pool(pool))
    }

    fn shutdown(&self) {
        self.servers.stop();
        self.mounts.unmount_all();
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        for p in pools {
            if let Err(e) = p.export(false) {
                eprintln!("tarn: exporting pool '{}': {e}", p.name());
            }
        }
        // The cache keeps listing them: they come back at the next start.
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Paths come from clients: only absolute ones, so nothing depends on the
/// daemon's working directory.
fn absolute_path(p: &str) -> Result<&Path, ApiError> {
    let path = Path::new(p);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(ApiError::invalid(format!("{p:?} is not an absolute path")))
    }
}

/// A counter that makes temporary file names unique within the daemon.
fn next_tmp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Writes a small file so that readers see the old or the new contents,
/// never a mix: temporary file, fsync, rename, fsync of the directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}-{}", std::process::id(), next_tmp()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
