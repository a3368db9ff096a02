//! The node's pools: the set the daemon has imported, and its state.
//!
//! The daemon keeps two small files in its state directory:
//!
//! - `daemon-id`: a random identity written on first start. It is recorded as
//!   the owner in the labels of every pool this daemon imports, so after a
//!   crash the same daemon may take its pools back without `--force`, while
//!   another daemon (or host) is asked for `--force`.
//! - `pools.json`: the pools to import at start (name, GUID, device paths),
//!   rewritten atomically (temp file + rename) whenever the set changes. One
//!   that cannot be read or decoded stops the start with an error that
//!   says how to recover: rewriting it would forget the pools it lists.
//!
//! Pool operations run on the calling connection's thread; the pool layer
//! does its own locking, so requests to different pools do not wait for
//! each other and a failing pool does not block the others, except where
//! they meet in the node's own maps: opening a dataset's filesystem holds
//! the `filesystems` map while it waits for that pool's lock (the locks and
//! their order: docs/design.md, "Locks").
//!
//! The API methods on them are in `node` (pools, datasets, users, shares,
//! mounts) and `objects` (files at the top of a pool's root filesystem);
//! the conversions to API types in `convert`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};
use tarn_api::ApiError;
use tarn_pool::{Pool, PoolOptions};
use tarn_webdav::{Authenticator, Principal};

use crate::access;
use crate::error::{DaemonError, Result};
use crate::filesystems::Filesystems;
use crate::mounts::Mounts;
use crate::servers::{
    iscsi_entry, nbd_entry, share_entries, Endpoints, ServerOptions, Servers, ShareLists,
};

/// The daemon's knobs for its pools; every one is a bound or an interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Seconds between txg syncs while anything is dirty.
    pub txg_interval_secs: u64,
    /// Dirty data per pool before writers wait, in MiB; 0 for the default
    /// ([`default_dirty_max_bytes`]: a tenth of the memory, 256 MiB to 4
    /// GiB).
    pub dirty_max_mib: u64,
    /// Block cache shared by all pools, in MiB; 0 for the default (an
    /// eighth of the memory, at least 256 MiB).
    pub cache_mib: u64,
    /// Threads serving each FUSE mount's requests (1 to
    /// [`tarn_fuse::MAX_THREADS`]).
    pub fuse_threads: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            txg_interval_secs: 5,
            dirty_max_mib: 0,
            cache_mib: 0,
            fuse_threads: tarn_fuse::DEFAULT_THREADS,
        }
    }
}

/// The least default dirty limit: what every machine got before the
/// default scaled with memory.
const DIRTY_MIN_DEFAULT: u64 = 256 << 20;
/// The largest default dirty limit: a txg larger than this takes long to
/// commit on a home server's disks, and writers wait for it at the limit.
const DIRTY_MAX_DEFAULT: u64 = 4 << 30;

/// The dirty limit per pool when none is configured, for `memory` bytes of
/// memory (`None`: unknown, taken as 2 GiB): a tenth of it, at least 256
/// MiB and at most 4 GiB, as OpenZFS sizes its own. OpenZFS's is one limit
/// for all pools; here each pool has its own, so a daemon with several
/// pools that all take writes at once may hold a tenth per pool.
///
/// Why it scales: a txg holds every write since the last one, so the
/// larger it may grow, the more often rewrites of one block meet in it and
/// are written once (4k random writes into 16K volume blocks: each block
/// takes four), and the fewer, larger commits a stream of writes costs.
/// The memory is held only while writes wait for their commit.
pub fn default_dirty_max_bytes(memory: Option<u64>) -> u64 {
    (memory.unwrap_or(2 << 30) / 10).clamp(DIRTY_MIN_DEFAULT, DIRTY_MAX_DEFAULT)
}

/// One pool the daemon imports at start.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct CacheEntry {
    pub(crate) name: String,
    pub(crate) guid: String,
    devices: Vec<PathBuf>,
}

/// Every imported pool of this daemon.
pub struct Pools {
    state_dir: PathBuf,
    pub(crate) opts: PoolOptions,
    pools: Mutex<BTreeMap<String, Arc<Pool>>>,
    /// Names being created or imported right now (lock order: `pools`
    /// first, then `pending`).
    pub(crate) pending: Mutex<BTreeSet<String>>,
    /// Cached pools that could not be imported at start: kept in the cache
    /// and listed as UNAVAIL until they are imported or destroyed.
    pub(crate) unavailable: Mutex<Vec<CacheEntry>>,
    /// Serializes rewrites of `pools.json`.
    cache_lock: Mutex<()>,
    /// Serializes changes of users and shares, so the checks of one (a
    /// share's CHAP user has a secret, an iSCSI name is unused) and the
    /// write they allow see one state.
    pub(crate) access_lock: Mutex<()>,
    /// Exclusive lock on the state directory: one daemon per state.
    _state_lock: std::fs::File,
    /// FUSE mounts of datasets.
    pub(crate) mounts: Mounts,
    /// The one filesystem object of each dataset in use.
    pub(crate) fss: Filesystems,
    /// NFS and WebDAV.
    pub(crate) servers: Servers,
    /// The replication port, when it runs.
    pub(crate) replication: Mutex<Option<crate::replication::Replication>>,
    /// The metrics endpoint, when it runs.
    pub(crate) metrics: Mutex<Option<crate::metrics::MetricsServer>>,
    /// The HTTPS API, when it runs.
    pub(crate) web: Mutex<Option<tarn_web::Running>>,
    /// The sampled history of rates (`stats.history`).
    pub(crate) history: Mutex<Option<crate::history::History>>,
    /// The replication tokens.
    pub(crate) tokens: Arc<crate::replication::Tokens>,
    /// The HTTPS API's bearer tokens.
    pub(crate) api_tokens: Arc<crate::replication::Tokens>,
    /// The web page's share links.
    pub(crate) links: crate::links::Links,
    /// Datasets a receive is running into.
    pub(crate) receives: Mutex<BTreeSet<String>>,
    /// Serializes handing the servers their lists (and Samba its service
    /// mounts), and what must not race with it (a key unload's teardown):
    /// two refreshes at once could mount one share twice.
    pub(crate) serve_lock: Mutex<()>,
    /// One schedule run at a time (the scheduler's and `schedule.run`'s).
    pub(crate) schedule_lock: Mutex<()>,
    /// Stored schedules found not to run, and why, that the owner was told
    /// of (once per daemon run and reason: `schedule::not_run`).
    pub(crate) schedules_not_run: Mutex<BTreeSet<String>>,
    /// This daemon's identity (`STATE/node-id`, made at the first start):
    /// replication schedules run only on the daemon that added them.
    pub(crate) node_id: String,
    /// Long schedule runs (replications) in progress, `POOL/NAME`.
    pub(crate) long_runs: Mutex<BTreeSet<String>>,
    /// The admin socket, which scheduled replications run `tarn
    /// replicate` against (set when the daemon serves one).
    pub(crate) admin_socket: std::sync::OnceLock<PathBuf>,
    /// The thread that runs schedules.
    pub(crate) scheduler: Mutex<Option<crate::periodic::Periodic>>,
    /// The event log and the alerts.
    pub(crate) events: crate::events::Events,
    /// What the last disk health look saw.
    pub(crate) health: crate::health::Watch,
}

/// Checks WebDAV logins against the users stored in the pools.
struct PoolUsers {
    pools: Weak<Pools>,
}

impl Authenticator for PoolUsers {
    fn check(&self, user: &str, password: &str) -> Option<Principal> {
        self.check_in(None, user, password)
    }

    /// Users are per pool: a share is used by the users of the pool that
    /// stores it (its realm), never by a user of the same name in another.
    fn check_in(&self, realm: Option<&str>, user: &str, password: &str) -> Option<Principal> {
        let pools = self.pools.upgrade()?;
        let all = pools.all_pools();
        let mine = || all.iter().filter(|p| realm.is_none_or(|r| p.name() == r));
        let found = mine().find_map(|p| access::authenticate(p, user, password));
        if found.is_none() && !mine().any(|p| access::user(p, user).is_ok()) {
            // As long as for a name that exists: the time tells nothing.
            let _ = access::verify_password(access::decoy_hash(), password);
        }
        let rec = found?;
        Some(Principal {
            name: rec.name,
            uid: rec.uid,
            gid: rec.gid,
            groups: Vec::new(),
            // What a user may do on each share is the share's user list.
            can_write: true,
        })
    }
}

/// A pool name reserved while a create or import runs.
pub(crate) struct NameGuard<'a> {
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

/// Loads a pool's datasets; a failure leaves the pool usable at the pool
/// level and is reported, and dataset commands then say why they fail.
pub(crate) fn attach_datasets(pool: &Arc<Pool>) {
    if let Err(e) = tarn_dataset::attach(pool) {
        log::warn!(
            "tarn: pool '{}': cannot load its datasets: {e}",
            pool.name()
        );
        return;
    }
    // Keys kept in files are loaded now; the rest wait for `tarn key load`.
    crate::keys::autoload(pool);
}

/// The pool part of a dataset name (`tank` of `tank/a@s`).
pub(crate) fn pool_of(name: &str) -> &str {
    name.split(['/', '@']).next().unwrap_or(name)
}

/// `dataset`, as a record stored in `pool` names it, under the pool's
/// current name. Records (shares, schedules) name their datasets with the
/// pool's name first, and a pool imported under a new name (`tarn pool
/// import tank vault`) keeps records that still say the old one. A record
/// stored in a pool only ever means that pool's own datasets, so its
/// first component is read as the pool's name: the shares and schedules
/// move with the disks whatever the pool is called.
pub(crate) fn named_in(pool: &str, dataset: &str) -> String {
    format!("{pool}{}", &dataset[pool_of(dataset).len()..])
}

impl Pools {
    /// Opens (creating) the state directory and imports the pools the
    /// daemon owned when it last ran. A pool that cannot be imported is
    /// reported on stderr and skipped; the others still come up.
    pub fn open(state_dir: &Path, tuning: &Tuning) -> Result<Pools> {
        std::fs::create_dir_all(state_dir).map_err(|e| {
            DaemonError::msg(format!(
                "cannot create state directory {}: {e}; choose another with --state-dir",
                state_dir.display()
            ))
        })?;
        let state_lock = std::fs::File::create(state_dir.join("lock"))?;
        if state_lock.try_lock().is_err() {
            return Err(DaemonError::msg(format!(
                "another tarn daemon is using the state directory {}; stop it first or pass another --state-dir",
                state_dir.display()
            )));
        }
        let id_path = state_dir.join("daemon-id");
        let id = match std::fs::read_to_string(&id_path) {
            Ok(s) if !s.trim().is_empty() => s.trim().to_string(),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(DaemonError::msg(format!(
                    "cannot read {}: {e}",
                    id_path.display()
                )))
            }
            _ => {
                let mut b = [0u8; 8];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut f| f.read_exact(&mut b))
                    .map_err(|e| DaemonError::msg(format!("cannot read /dev/urandom: {e}")))?;
                let id = format!("{:016x}", u64::from_le_bytes(b));
                write_atomically(&id_path, id.as_bytes(), 0o644)?;
                id
            }
        };
        // After the state lock: the crash marker is this daemon's.
        let events = crate::events::Events::open(state_dir)?;
        let dirty_max = match tuning.dirty_max_mib {
            0 => default_dirty_max_bytes(tarn_block::cache::physical_memory()),
            mib => mib << 20,
        };
        log::info!("tarn: dirty data per pool: {} MiB", dirty_max >> 20);
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
            access_lock: Mutex::new(()),
            _state_lock: state_lock,
            mounts: Mounts::new(tuning.fuse_threads),
            fss: Filesystems::default(),
            servers: Servers::default(),
            replication: Mutex::new(None),
            metrics: Mutex::new(None),
            web: Mutex::new(None),
            history: Mutex::new(None),
            tokens: Arc::new(crate::replication::Tokens::new(state_dir)),
            api_tokens: Arc::new(crate::replication::Tokens::api(state_dir)),
            links: crate::links::Links::new(state_dir),
            receives: Mutex::new(BTreeSet::new()),
            serve_lock: Mutex::new(()),
            schedule_lock: Mutex::new(()),
            schedules_not_run: Mutex::new(BTreeSet::new()),
            long_runs: Mutex::new(BTreeSet::new()),
            node_id: node_id(state_dir)?,
            admin_socket: std::sync::OnceLock::new(),
            events,
            health: crate::health::Watch::default(),
            scheduler: Mutex::new(None),
        };
        for entry in me.read_cache()? {
            match Pool::import_recorded(
                &entry.devices,
                &entry.guid,
                Some(&entry.name),
                false,
                me.opts.clone(),
            ) {
                Ok(pool) => {
                    attach_datasets(&pool);
                    log::info!(
                        "tarn: imported pool '{}' (state {})",
                        entry.name,
                        pool.health()
                    );
                    me.mounts.automount(&me.fss, &pool);
                    me.lock().insert(entry.name.clone(), pool);
                }
                Err(e) => {
                    // Kept in the cache: disks may come late, or be fixed.
                    log::warn!("tarn: cannot import pool '{}': {e}", entry.name);
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

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Pool>>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cache_path(&self) -> PathBuf {
        self.state_dir.join("pools.json")
    }

    /// The pools to import at start. A missing file is an empty list; a
    /// file that cannot be read or decoded stops the start: going on
    /// without it would rewrite it with only the pools imported this time,
    /// silently forgetting the others.
    fn read_cache(&self) -> Result<Vec<CacheEntry>> {
        let path = self.cache_path();
        let shown = path.display();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(DaemonError::msg(format!(
                    "cannot read {shown}, the list of pools this daemon imports at start: {e}\n\
                     hint: fix its permissions (or the disk under it) and start again"
                )))
            }
        };
        serde_json::from_slice(&bytes).map_err(|e| {
            DaemonError::msg(format!(
                "{shown} is damaged ({e}); it lists the pools this daemon imports at start, \
                 so the daemon does not start rather than rewrite it without them\n\
                 hint: repair it, or move it aside (mv {shown} {shown}.damaged) to start with \
                 no pools and bring each one back with `tarn pool import`"
            ))
        })
    }

    /// Rewrites the pool cache atomically; writers are serialized so the
    /// last state always wins.
    pub(crate) fn write_cache(&self) {
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
            .and_then(|b| write_atomically(&self.cache_path(), &b, 0o644));
        if let Err(e) = result {
            log::warn!("tarn: cannot save {}: {e}", self.cache_path().display());
        }
    }

    /// Reserves `name` for a create or import; fails if it is taken.
    pub(crate) fn reserve(&self, name: &str) -> Result<NameGuard<'_>, ApiError> {
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
    pub(crate) fn forget(&self, pool: &Arc<Pool>) {
        let mut pools = self.lock();
        if pools.get(pool.name()).is_some_and(|p| Arc::ptr_eq(p, pool)) {
            pools.remove(pool.name());
        }
    }

    /// Whether `path` is a device of an imported pool.
    pub(crate) fn is_pool_device(&self, path: &Path) -> bool {
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        self.lock()
            .values()
            .any(|p| p.device_paths().contains(&canon))
    }

    /// Every imported pool.
    pub fn all_pools(&self) -> Vec<Arc<Pool>> {
        self.lock().values().cloned().collect()
    }

    /// The NFS exports, WebDAV shares, NBD exports and iSCSI targets of
    /// every pool's stored shares.
    pub fn share_lists(&self) -> ShareLists {
        let mut lists = self.share_lists_unchecked();
        // A target whose mutual CHAP secret another target takes from
        // initiators is left out (the iSCSI server would refuse the list).
        let bad = tarn_iscsi::reflected(&lists.iscsi);
        for i in bad.into_iter().rev() {
            let t = lists.iscsi.remove(i);
            log::warn!(
                "tarn: target {} is not served over iSCSI: its mutual CHAP user's secret is \
                 also the CHAP secret of an initiator user of some iSCSI share; give the \
                 mutual user a secret of its own (`tarn user chap USER`)",
                t.name
            );
        }
        lists
    }

    fn share_lists_unchecked(&self) -> ShareLists {
        let mut lists = ShareLists::default();
        let smb_on = self.servers.smb_layout().is_some();
        for pool in self.all_pools() {
            if smb_on {
                match access::users(&pool) {
                    Ok(users) => lists.smb_users.extend(users.into_iter().filter_map(|u| {
                        Some(crate::smb::SmbUser {
                            nt_hash: u.nt_hash?,
                            name: u.name,
                            uid: u.uid,
                            gid: u.gid,
                        })
                    })),
                    Err(e) => lists.smb_problems.push(format!(
                        "pool '{}': cannot read its users: {e}",
                        pool.name()
                    )),
                }
            }
            let list = match access::shares(&pool) {
                Ok(l) => l,
                Err(e) => {
                    log::warn!("tarn: pool '{}': cannot read its shares: {e}", pool.name());
                    continue;
                }
            };
            for share in list {
                if share.nbd.is_some() {
                    if lists.nbd.iter().any(|e| e.name == share.name) {
                        // Two pools imported with a share of one name: the
                        // first keeps it, so the rest are still served.
                        name_taken("NBD", &share.name, pool.name());
                    } else {
                        match self.fss.volume(&pool, &share.dataset) {
                            Ok(v) => lists.nbd.extend(nbd_entry(v, &share)),
                            Err(e) => log::warn!("tarn: share '{}': {e}", share.name),
                        }
                    }
                }
                if let Some(i) = &share.iscsi {
                    let users = access::users(&pool).unwrap_or_else(|e| {
                        log::warn!("tarn: pool '{}': cannot read its users: {e}", pool.name());
                        Vec::new()
                    });
                    let target = self
                        .fss
                        .volume(&pool, &share.dataset)
                        .map_err(|e| e.to_string())
                        .and_then(|v| iscsi_entry(v, &share, i, &users));
                    match target {
                        Ok(t) if lists.iscsi.iter().any(|o| o.name == t.name) => log::warn!(
                            "tarn: share '{}' of pool '{}' is not served over iSCSI: another \
                             share serves the target {}",
                            share.name,
                            pool.name(),
                            t.name
                        ),
                        Ok(t) => lists.iscsi.push(t),
                        Err(e) => {
                            log::warn!("tarn: share '{}' is not served over iSCSI: {e}", share.name)
                        }
                    }
                }
                if let (Some(m), true) = (&share.smb, smb_on) {
                    if lists
                        .smb
                        .iter()
                        .any(|w| w.name.eq_ignore_ascii_case(&share.name))
                    {
                        lists.smb_problems.push(format!(
                            "share '{}' of pool '{}' is not served over SMB: another share has \
                             that name (SMB names do not differ by case)",
                            share.name,
                            pool.name()
                        ));
                    } else if crate::smb::reserved_share_name(&share.name) {
                        lists.smb_problems.push(format!(
                            "share '{}' is not served over SMB: Samba reserves the name",
                            share.name
                        ));
                    } else if let Err(e) = smb_names_ok(&share) {
                        // What `share add` checks, checked again: a pool's
                        // records may have been written elsewhere (a pool
                        // from another machine), and these names become a
                        // folder path and lines of smb.conf.
                        lists.smb_problems.push(format!(
                            "share '{}' of pool '{}' is not served over SMB: {}",
                            share.name,
                            pool.name(),
                            e.message
                        ));
                    } else {
                        match self.fss.get(&pool, &share.dataset) {
                            Ok(fs) => lists.smb.push(crate::servers::SmbWant {
                                name: share.name.clone(),
                                dataset: share.dataset.clone(),
                                share: m.clone(),
                                fs,
                            }),
                            Err(e) => lists.smb_problems.push(format!(
                                "share '{}' is not served over SMB: {e}",
                                share.name
                            )),
                        }
                    }
                }
                if share.nfs.is_none() && share.webdav.is_none() {
                    continue;
                }
                let fs = match self.fss.get(&pool, &share.dataset) {
                    Ok(fs) => fs,
                    Err(e) => {
                        log::warn!("tarn: share '{}': {e}", share.name);
                        continue;
                    }
                };
                // The servers take their lists whole or not at all: one
                // bad entry (two pools imported with a share of one name,
                // a dataset whose root cannot be read) must cost that
                // entry, not keep every later change (a share removed, its
                // networks narrowed) from reaching them.
                if let Err(e) = fs.getattr(tarn_fs::ROOT_INO) {
                    log::warn!(
                        "tarn: share '{}' of pool '{}' is not served over NFS or WebDAV: its \
                         root cannot be read: {e}",
                        share.name,
                        pool.name()
                    );
                    continue;
                }
                let (export, dav) = share_entries(fs, &share);
                if let Some(e) = export {
                    if lists.nfs.iter().any(|o| o.path == e.path) {
                        name_taken("NFS", &share.name, pool.name());
                    } else {
                        lists.nfs.push(e);
                    }
                }
                if let Some(w) = dav {
                    if lists.webdav.iter().any(|o| o.name == w.name) {
                        name_taken("WebDAV", &share.name, pool.name());
                    } else {
                        lists.webdav.push(w);
                    }
                }
            }
        }
        lists
    }

    /// Starts NFS and WebDAV as the options say.
    pub fn start_servers(self: &Arc<Self>, opts: &ServerOptions) -> Result<()> {
        let auth = Arc::new(PoolUsers {
            pools: Arc::downgrade(self),
        });
        self.servers
            .start(opts, &self.state_dir, self.share_lists(), auth)?;
        if let Some(bind) = opts.smb {
            self.servers
                .start_smb(bind, opts.smb_include.clone(), &self.state_dir)?;
            self.mounts.set_closer(self.servers.smb_closer());
            self.refresh_servers();
        }
        if let Some(addr) = opts.replication {
            let cfg = crate::servers::tls_config(opts, &self.state_dir);
            let (tls, fp) = tarn_webdav::tls_server_config(&cfg)
                .map_err(|e| DaemonError::msg(format!("replication TLS: {e}")))?;
            let mut tls = (*tls).clone();
            tls.alpn_protocols.clear();
            let me: Arc<dyn tarn_api::Backend + Send + Sync> = self.clone();
            let r = crate::replication::start(
                addr,
                Arc::new(tls),
                fp,
                self.tokens.clone(),
                Arc::downgrade(&me),
            )?;
            *self.replication.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        }
        if let Some(addr) = opts.metrics {
            let m = crate::metrics::MetricsServer::start(
                addr,
                opts.metrics_token.clone(),
                Arc::downgrade(self),
            )
            .map_err(DaemonError::msg)?;
            *self.metrics.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
        }
        if let Some(addr) = opts.web {
            let w = crate::web::start(self, addr, opts, &self.state_dir)?;
            *self.web.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
        }
        Ok(())
    }

    /// Every device of every pool, with its pool: (device, pool).
    pub(crate) fn devices(&self) -> Vec<(String, String)> {
        use tarn_api::Backend;
        self.pool_status(None)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|st| {
                let mut all = crate::health::leaves(&st.vdevs);
                all.extend(crate::health::leaves(&st.logs));
                all.into_iter().map(move |d| (d, st.name.clone()))
            })
            .collect()
    }

    /// Looks at the disks' health when it is due and records new warnings
    /// as events.
    pub(crate) fn watch_health(&self) {
        for (h, new) in self.health.look(&self.devices()) {
            let what = [h.model.as_deref(), h.serial.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ");
            self.events.emit(
                if h.critical {
                    tarn_api::events::Severity::Critical
                } else {
                    tarn_api::events::Severity::Warning
                },
                "disk.warning",
                Some(&h.pool),
                Some(&h.device),
                format!(
                    "disk {} ({what}) of pool '{}': {}",
                    h.device,
                    h.pool,
                    new.join("; ")
                ),
            );
        }
    }

    /// Starts sampling the history of rates (`stats.history`).
    pub fn start_history(self: &Arc<Self>) -> Result<()> {
        let h = crate::history::History::start(Arc::downgrade(self))
            .map_err(|e| DaemonError::msg(format!("cannot start the history: {e}")))?;
        *self.history.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        Ok(())
    }

    /// Starts running the pools' schedules.
    pub fn start_scheduler(self: &Arc<Self>) -> Result<()> {
        let s = crate::schedule::start_scheduler(Arc::downgrade(self))
            .map_err(|e| DaemonError::msg(format!("cannot start the scheduler: {e}")))?;
        *self.scheduler.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        Ok(())
    }

    /// Gives the running servers the current shares (after any change of
    /// shares, pools or datasets).
    pub(crate) fn refresh_servers(&self) {
        let _serving = self.serve_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut lists = self.share_lists();
        self.serve_smb(&mut lists);
        self.servers.update(lists);
    }

    /// Mounts what the SMB shares need (service mounts) and hands Samba
    /// the shares that could be mounted, with the users.
    fn serve_smb(&self, lists: &mut ShareLists) {
        let Some(layout) = self.servers.smb_layout() else {
            return;
        };
        let wants = std::mem::take(&mut lists.smb);
        let mut problems = std::mem::take(&mut lists.smb_problems);
        let users = crate::smb::usable_users(std::mem::take(&mut lists.smb_users), &mut problems);
        let mut entries = Vec::new();
        let mut service = Vec::new();
        for w in wants {
            let path = layout.mountpoint(&w.name);
            entries.push(crate::smb::SmbEntry {
                name: w.name.clone(),
                dataset: w.dataset.clone(),
                share: w.share,
                path: path.clone(),
            });
            service.push(crate::mounts::ServiceWant {
                share: w.name,
                dataset: w.dataset,
                fs: w.fs,
                path,
            });
        }
        for (share, why) in self.mounts.sync_service(service) {
            problems.push(format!("share '{share}' is not served over SMB: {why}"));
            entries.retain(|e| e.name != share);
        }
        for p in &problems {
            log::warn!("tarn: {p}");
        }
        self.servers.update_smb(&entries, &users, problems);
    }

    /// The pool that stores users: the named one, or the only one.
    pub(crate) fn pool_for_users(&self, pool: Option<&str>) -> Result<Arc<Pool>, ApiError> {
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

    pub(crate) fn get(&self, name: &str) -> Result<Arc<Pool>, ApiError> {
        self.lock().get(name).cloned().ok_or_else(|| {
            ApiError::not_found(format!(
                "no pool '{name}' is imported; `tarn pool list` shows the pools, `tarn pool import` finds others"
            ))
        })
    }

    /// Where the NFS and WebDAV servers listen (none when not running).
    pub fn endpoints(&self) -> Endpoints {
        self.servers.endpoints()
    }
}

/// A counter that makes temporary file names unique within the daemon.
pub(crate) fn next_tmp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Writes a small file of the state directory so that readers see the old
/// or the new contents, never a mix, and the new contents survive a crash
/// once this returns: temporary file (created with `mode`), fsync, rename,
/// fsync of the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp-{}-{}", std::process::id(), next_tmp()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Reads `STATE/node-id`, or makes it (32 random hex digits).
fn node_id(state_dir: &Path) -> Result<String> {
    let path = state_dir.join("node-id");
    if let Ok(s) = std::fs::read_to_string(&path) {
        let s = s.trim();
        if s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(s.to_string());
        }
    }
    let mut raw = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| DaemonError::msg("no randomness for the node id"))?;
    let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, format!("{id}\n"))
        .map_err(|e| DaemonError::msg(format!("cannot write {}: {e}", path.display())))?;
    Ok(id)
}

/// The names of `share` that SMB turns into a folder path and lines of
/// smb.conf (its own, its users'), held to the rules `share add` and
/// `user add` apply when they are made.
/// Logs that share `share` of `pool` is not served over `what`: two
/// pools imported with a share of one name, the first keeps it.
fn name_taken(what: &str, share: &str, pool: &str) {
    log::warn!(
        "tarn: share '{share}' of pool '{pool}' is not served over {what}: another pool has a \
         share of that name"
    );
}

fn smb_names_ok(share: &tarn_api::access::Share) -> std::result::Result<(), ApiError> {
    tarn_api::access::check_share_name(&share.name)?;
    // The dataset's name becomes the share's comment: a value smb.conf
    // cannot hold would stop the whole file from being written (and every
    // later change, a removed user included, from reaching Samba).
    crate::smb::conf_value("dataset name", &share.dataset)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if let Some(m) = &share.smb {
        for u in m.users.keys() {
            tarn_api::access::check_user_name(u)?;
        }
        // Samba reads an empty list of valid users as "anyone".
        if m.users.is_empty() && !m.guest {
            return Err(ApiError::invalid(
                "it names no users and is not open to guests (Samba would let anyone in)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_its_own_pool_whatever_it_says() {
        for (stored, read) in [
            ("tank", "vault"),
            ("tank/a", "vault/a"),
            ("tank/a/b@snap", "vault/a/b@snap"),
            ("tank@snap", "vault@snap"),
            ("vault/a", "vault/a"),
            ("tank2/tank/a", "vault/tank/a"),
        ] {
            assert_eq!(named_in("vault", stored), read, "{stored}");
        }
    }

    #[test]
    fn smb_names_are_checked_again_where_shares_are_served_from() {
        use tarn_api::access::{Access, Share, SmbShare};
        let share = |name: &str, user: &str| Share {
            name: name.into(),
            dataset: "tank/a".into(),
            nfs: None,
            webdav: None,
            nbd: None,
            iscsi: None,
            smb: Some(SmbShare {
                users: [(user.to_string(), Access::Rw)].into_iter().collect(),
                ..SmbShare::default()
            }),
        };
        assert!(smb_names_ok(&share("photos", "alice")).is_ok());
        let mut odd = share("photos", "alice");
        odd.dataset = "tank/a\n[global]".into();
        assert!(
            smb_names_ok(&odd).is_err(),
            "a dataset name smb.conf cannot hold"
        );
        for (name, user) in [
            ("../../etc", "alice"),
            ("/etc", "alice"),
            ("photos", "eve\n  root preexec = /bin/sh"),
            ("photos", "Eve"),
            // Read by Samba as "every authenticated user".
            ("photos", "s-1-5-11"),
        ] {
            assert!(smb_names_ok(&share(name, user)).is_err(), "{name} {user:?}");
        }
        // No users and no guests: Samba would let anyone in.
        let mut nobody = share("photos", "alice");
        if let Some(m) = nobody.smb.as_mut() {
            m.users.clear();
        }
        assert!(smb_names_ok(&nobody).is_err(), "an empty list of users");
        if let Some(m) = nobody.smb.as_mut() {
            m.guest = true;
        }
        assert!(smb_names_ok(&nobody).is_ok(), "a guest share");
    }

    #[test]
    fn the_default_dirty_limit_is_a_tenth_of_memory_within_its_bounds() {
        const GIB: u64 = 1 << 30;
        // Unknown memory is taken as 2 GiB, whose tenth is below the floor:
        // 256 MiB, the old fixed default.
        assert_eq!(default_dirty_max_bytes(None), DIRTY_MIN_DEFAULT);
        assert_eq!(default_dirty_max_bytes(Some(GIB)), DIRTY_MIN_DEFAULT);
        assert_eq!(default_dirty_max_bytes(Some(10 * GIB)), GIB);
        assert_eq!(default_dirty_max_bytes(Some(24 * GIB)), 24 * GIB / 10);
        assert_eq!(default_dirty_max_bytes(Some(64 * GIB)), DIRTY_MAX_DEFAULT);
        assert_eq!(default_dirty_max_bytes(Some(u64::MAX)), DIRTY_MAX_DEFAULT);
        // Never shrinks as memory grows, and stays within its bounds.
        let mut last = 0;
        for mib in (0..=128 * 1024u64).step_by(97) {
            let d = default_dirty_max_bytes(Some(mib << 20));
            assert!(
                (DIRTY_MIN_DEFAULT..=DIRTY_MAX_DEFAULT).contains(&d),
                "{mib} MiB: {d}"
            );
            assert!(d >= last, "{mib} MiB: {d} after {last}");
            last = d;
        }
    }

    /// The daemon's pools get the limit its tuning asks for: 0 is the
    /// memory-scaled default, anything else that many MiB; a sync starts
    /// at a quarter of it.
    #[test]
    fn the_pools_take_the_dirty_limit_of_the_tuning() {
        let dir = tempfile::tempdir().unwrap();
        let pools = Pools::open(dir.path(), &Tuning::default()).unwrap();
        let want = default_dirty_max_bytes(tarn_block::cache::physical_memory());
        assert_eq!(pools.opts.dirty_max_bytes, want);
        assert_eq!(pools.opts.dirty_sync_bytes, want / 4);
        drop(pools);
        let tuning = Tuning {
            dirty_max_mib: 64,
            ..Tuning::default()
        };
        let pools = Pools::open(dir.path(), &tuning).unwrap();
        assert_eq!(pools.opts.dirty_max_bytes, 64 << 20);
        assert_eq!(pools.opts.dirty_sync_bytes, 16 << 20);
    }

    #[test]
    fn a_damaged_pool_list_stops_the_start_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("pools.json");
        let damaged = br#"[{"name":"tank","guid":"00c0ffee","devices":["/dev/sdb"]},{"name":"#;
        std::fs::write(&list, damaged).unwrap();
        let err = Pools::open(dir.path(), &Tuning::default())
            .err()
            .expect("a damaged pools.json must stop the start");
        let text = err.to_string();
        assert!(text.contains("pools.json is damaged"), "{text}");
        assert!(text.contains("tarn pool import"), "{text}");
        assert_eq!(std::fs::read(&list).unwrap(), damaged, "left as it was");

        // A list that decodes is used; an absent one is an empty list.
        std::fs::write(&list, b"[]").unwrap();
        drop(Pools::open(dir.path(), &Tuning::default()).unwrap());
        std::fs::remove_file(&list).unwrap();
        drop(Pools::open(dir.path(), &Tuning::default()).unwrap());
        assert_eq!(std::fs::read(&list).unwrap(), b"[]");
    }

    #[test]
    fn state_files_are_replaced_whole_with_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_atomically(&path, b"one", 0o600).unwrap();
        write_atomically(&path, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"], "no temporary file left behind");
        assert!(write_atomically(&dir.path().join("no/such/dir/f"), b"x", 0o600).is_err());
    }
}
