//! Finding pools on devices and importing them.
//!
//! Devices are recognised by their labels, never by their paths: import reads
//! the label of every candidate device, groups them by pool GUID, takes the
//! newest configuration (highest label txg), and matches each leaf of that
//! configuration to a device by its device GUID, wherever it now lives. Then
//! it collects the uberblocks of every present leaf and takes the newest one
//! whose meta tree and space maps verify completely (a torn or damaged newest
//! txg costs that txg, never the pool).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tarn_space::SpaceMap;
use tarn_tree::Tree;
use tarn_vdev::{LabelConfig, Leaf, LeafState, PoolState, TopHealth, TopVdev};

use crate::config::{PoolOptions, PoolProps};
use crate::pool::{MetaState, Pool, K_PROPS, K_STATE};
use crate::status::{Health, ImportCandidate};
use crate::store::ReadStore;
use crate::sync::{decode_space_root, read_space_root, SpaceBlocks};
use crate::uberblock::Uberblock;
use crate::vdevs::lock_device;
use crate::PoolError;

/// A device with a readable tarn label.
struct Found {
    path: PathBuf,
    leaf: Arc<dyn Leaf>,
    config: LabelConfig,
}

/// Lists the candidate device files of `dirs` (regular files and block
/// devices, not recursing; links followed, so `/dev/disk/by-id`, a folder
/// of links, finds its disks) plus the explicit `devices`, each once
/// however many names lead to it.
fn candidates(dirs: &[PathBuf], devices: &[PathBuf]) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut out: Vec<PathBuf> = devices.to_vec();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(md) = std::fs::metadata(e.path()) else {
                continue;
            };
            if md.is_file() || md.file_type().is_block_device() {
                out.push(e.path());
            }
        }
    }
    let mut out: Vec<PathBuf> = out
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn scan_labels(dirs: &[PathBuf], devices: &[PathBuf]) -> Vec<Found> {
    let mut out = Vec::new();
    for p in candidates(dirs, devices) {
        let Ok(leaf) = tarn_vdev::open_device(&p) else {
            continue;
        };
        let Ok(l) = tarn_vdev::read_label(leaf.as_ref()) else {
            continue;
        };
        let path = std::fs::canonicalize(&p).unwrap_or(p);
        out.push(Found {
            path,
            leaf,
            config: l.config,
        });
    }
    out
}

/// The devices of the one pool named `which` (a name or a hex GUID) among
/// `groups`.
fn pick(groups: BTreeMap<u64, Vec<Found>>, which: &str) -> Result<Vec<Found>, PoolError> {
    let matching: Vec<u64> = groups
        .iter()
        .filter(|(g, f)| {
            let c = &f[0].config;
            c.state != PoolState::Destroyed
                && (c.pool_name == which || format!("{g:016x}") == which.to_ascii_lowercase())
        })
        .map(|(g, _)| *g)
        .collect();
    let guid = match matching.as_slice() {
            [] => {
                return Err(PoolError::NotFound(format!(
                    "no pool '{which}' found on the searched devices; run `tarn pool import -d DIR` to list what is there"
                )))
            }
            [g] => *g,
            _ => {
                return Err(PoolError::Invalid(format!(
                    "several pools are named '{which}'; import one by its GUID (see `tarn pool import -d DIR`)"
                )))
            }
        };
    groups
        .into_iter()
        .find(|(g, _)| *g == guid)
        .map(|(_, f)| f)
        .ok_or_else(|| PoolError::Internal("pool group vanished".into()))
}

/// Whether `found` holds every member its newest config names, log
/// devices included.
fn complete(found: &[Found]) -> bool {
    let cfg = &found[0].config;
    cfg.tree
        .iter()
        .chain(&cfg.logs)
        .flat_map(|t| &t.children)
        .all(|c| newest(found, c.guid).is_some())
}

/// Folders where members recorded at `devices` may be now: the links of
/// `/dev/disk/by-id` for members under `/dev`, each member file's folder
/// otherwise.
fn search_dirs(devices: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = std::collections::BTreeSet::new();
    for d in devices {
        if d.starts_with("/dev") {
            dirs.insert(PathBuf::from("/dev/disk/by-id"));
        } else if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(parent.to_path_buf());
        }
    }
    dirs.into_iter().filter(|d| d.is_dir()).collect()
}

/// Groups found devices by pool GUID; the newest config of each group leads.
fn group(found: Vec<Found>) -> BTreeMap<u64, Vec<Found>> {
    let mut g: BTreeMap<u64, Vec<Found>> = BTreeMap::new();
    for f in found {
        g.entry(f.config.pool_guid).or_default().push(f);
    }
    for v in g.values_mut() {
        v.sort_by_key(|f| std::cmp::Reverse(f.config.txg));
    }
    g
}

/// Matches the newest config's leaves to found devices by GUID.
fn match_leaves(cfg: &LabelConfig, found: &[Found]) -> Vec<Vec<Option<usize>>> {
    cfg.tree
        .iter()
        .map(|t| t.children.iter().map(|c| newest(found, c.guid)).collect())
        .collect()
}

/// The found device that is member `guid`: of several (a copy of a member
/// file beside it, an old disk image), the one with the newest label, so
/// a copy taken before the pool's configuration last changed never stands
/// in for the member; of equals, the first found.
fn newest(found: &[Found], guid: u64) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, f) in found.iter().enumerate() {
        if f.config.device_guid == guid && best.is_none_or(|b| f.config.txg > found[b].config.txg) {
            best = Some(i);
        }
    }
    best
}

/// Lists importable pools on the given directories and devices.
pub fn discover(dirs: &[PathBuf], devices: &[PathBuf]) -> Vec<ImportCandidate> {
    let mut out = Vec::new();
    for (guid, found) in group(scan_labels(dirs, devices)) {
        let cfg = &found[0].config;
        if cfg.state == PoolState::Destroyed {
            continue;
        }
        let m = match_leaves(cfg, &found);
        let mut health = Health::Online;
        let mut missing = Vec::new();
        for (t, row) in cfg.tree.iter().zip(&m) {
            let absent = row.iter().filter(|x| x.is_none()).count();
            let redundancy = match t.kind {
                tarn_vdev::VdevKind::Single => 0,
                tarn_vdev::VdevKind::Mirror => t.children.len().saturating_sub(1),
                tarn_vdev::VdevKind::Raidz { parity } => parity as usize,
            };
            if absent > redundancy {
                health = Health::Faulted;
            } else if absent > 0 && health == Health::Online {
                health = Health::Degraded;
            }
            for (c, x) in t.children.iter().zip(row) {
                if x.is_none() {
                    missing.push(c.path.display().to_string());
                }
            }
        }
        out.push(ImportCandidate {
            name: cfg.pool_name.clone(),
            guid: format!("{guid:016x}"),
            health,
            devices: found.iter().map(|f| f.path.display().to_string()).collect(),
            note: (!missing.is_empty()).then(|| format!("missing devices: {}", missing.join(", "))),
            active: cfg.state == PoolState::Active,
        });
    }
    out
}

/// Verifies the whole meta tree of an uberblock and loads the pool state.
fn load_txg(
    tops: &[Arc<TopVdev>],
    cache: &tarn_block::BlockCache,
    ub: &Uberblock,
) -> Result<(Tree, Vec<SpaceMap>, SpaceBlocks, PoolProps, MetaState), PoolError> {
    let rs = ReadStore {
        tops,
        cache,
        pool: ub.pool_guid,
    };
    if !ub.meta_root.is_hole() {
        tarn_tree::walk(&rs, &ub.meta_root, 0, &mut |_| Ok(()), &mut |_, _| Ok(()))?;
    }
    let (space_bytes, chunks) = read_space_root(tops, &ub.space_root)?;
    let space = decode_space_root(&space_bytes, tops.len())?;
    let space_blocks = SpaceBlocks {
        root: ub.space_root,
        chunks,
    };
    for (m, t) in space.iter().zip(tops) {
        // With a member missing, the vdev cannot know its recorded size from
        // the devices alone: adopt the one the space map was built for.
        t.pin_asize(m.asize())?;
        if m.asize() != t.asize() || m.align() != t.alloc_align() {
            return Err(PoolError::Corrupt(format!(
                "space map of size {} / unit {} does not fit a vdev of size {} / unit {}",
                m.asize(),
                m.align(),
                t.asize(),
                t.alloc_align()
            )));
        }
    }
    let mut meta = Tree::open(ub.meta_root);
    let props: PoolProps = match meta.get(&rs, K_PROPS)? {
        Some(v) => serde_json::from_slice(&v)
            .map_err(|e| PoolError::Corrupt(format!("pool properties: {e}")))?,
        None => PoolProps::default(),
    };
    if let Some(f) = props
        .features
        .iter()
        .find(|f| !crate::config::FEATURES.contains(&f.as_str()))
    {
        return Err(PoolError::Invalid(format!(
            "the pool uses the feature '{f}', which this version of tarn does not know: import \
             it with a newer tarn"
        )));
    }
    let ms = match meta.get(&rs, K_STATE)? {
        Some(v) => serde_json::from_slice(&v)
            .map_err(|e| PoolError::Corrupt(format!("pool state: {e}")))?,
        None => MetaState::default(),
    };
    Ok((meta, space, space_blocks, props, ms))
}

impl Pool {
    /// Imports the pool named `which` (a name or a hex GUID) from devices
    /// found in `dirs` and `devices`. An active pool (not exported) needs
    /// `force` unless this importer owned it last.
    pub fn import(
        dirs: &[PathBuf],
        devices: &[PathBuf],
        which: &str,
        new_name: Option<&str>,
        force: bool,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        let found = pick(group(scan_labels(dirs, devices)), which)?;
        Self::import_found(found, new_name, force, opts)
    }

    /// Imports pool `which` from the paths recorded for its members (a
    /// daemon's start). When they no longer lead to every member (disks
    /// renumbered at boot, so that `/dev/sdb` is another disk now; member
    /// files renamed beside the others), it also searches
    /// `/dev/disk/by-id` (for members under `/dev`) and the members' own
    /// folders; only then, so a stray copy of a member elsewhere is never
    /// even looked at while the recorded paths do. Of several copies of
    /// one member, the newest is taken (see `newest`).
    pub fn import_recorded(
        devices: &[PathBuf],
        which: &str,
        new_name: Option<&str>,
        force: bool,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        let first = pick(group(scan_labels(&[], devices)), which);
        let dirs = search_dirs(devices);
        let found = match first {
            Ok(found) if complete(&found) || dirs.is_empty() => found,
            Err(e) if dirs.is_empty() => return Err(e),
            _ => pick(group(scan_labels(&dirs, devices)), which)?,
        };
        Self::import_found(found, new_name, force, opts)
    }

    /// Imports the pool whose devices `found` are (its newest config first).
    fn import_found(
        found: Vec<Found>,
        new_name: Option<&str>,
        force: bool,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        let cfg = found[0].config.clone();
        let guid = cfg.pool_guid;
        if cfg.state == PoolState::Active
            && !force
            && cfg.owner.as_deref() != Some(opts.owner.as_str())
        {
            return Err(PoolError::InUse(format!(
                "pool '{}' was not exported and may be in use by {}; if that owner is gone, import with --force",
                cfg.pool_name,
                cfg.owner.as_deref().unwrap_or("another system")
            )));
        }
        let name = new_name.unwrap_or(&cfg.pool_name).to_string();
        crate::vdevs::check_pool_name(&name)?;
        let m = match_leaves(&cfg, &found);
        let mut locks = Vec::new();
        let mut tops = Vec::new();
        for (t, row) in cfg.tree.iter().zip(&m) {
            let mut leaves = Vec::new();
            let mut tc = t.clone();
            for (c, x) in tc.children.iter_mut().zip(row) {
                match x {
                    Some(i) => {
                        locks.push(lock_device(&found[*i].path)?);
                        c.path = found[*i].path.clone();
                        leaves.push(Some(Arc::clone(&found[*i].leaf)));
                    }
                    None => leaves.push(None),
                }
            }
            let top = TopVdev::open(&tc, cfg.ashift, leaves)?;
            for (ci, c) in tc.children.iter().enumerate() {
                if c.offline {
                    let _ = top.set_offline(ci, true);
                }
            }
            if matches!(top.health(), TopHealth::Faulted) {
                let missing: Vec<String> = tc
                    .children
                    .iter()
                    .zip(row)
                    .filter(|(_, x)| x.is_none())
                    .map(|(c, _)| c.path.display().to_string())
                    .collect();
                // A device taken offline holds the pool as it was when it
                // left: importing from it alone would silently roll back
                // every later change (its label says it is offline; see
                // `Pool::write_offline_label`).
                let offline: Vec<String> = tc
                    .children
                    .iter()
                    .zip(row)
                    .filter(|(c, x)| c.offline && x.is_some())
                    .map(|(c, _)| c.path.display().to_string())
                    .collect();
                if !offline.is_empty() {
                    return Err(PoolError::Faulted(format!(
                        "cannot import '{}': {} was taken offline and holds the pool as it was \
                         then, without every later change; the current state is on {}: attach \
                         them or search more directories with -d",
                        cfg.pool_name,
                        offline.join(", "),
                        if missing.is_empty() {
                            "its other devices".to_string()
                        } else {
                            missing.join(", ")
                        }
                    )));
                }
                return Err(PoolError::Faulted(format!(
                    "cannot import '{}': too many devices are missing ({}); attach them or search more directories with -d",
                    cfg.pool_name,
                    missing.join(", ")
                )));
            }
            tops.push(Arc::new(top));
        }
        // Log devices: a missing one may hold acknowledged synchronous
        // writes that exist nowhere else (see `logdev`).
        let mut logs = Vec::new();
        let mut missing_logs = Vec::new();
        for t in &cfg.logs {
            let mut tc = t.clone();
            let mut leaves = Vec::new();
            for c in tc.children.iter_mut() {
                match newest(found.as_slice(), c.guid) {
                    Some(i) => {
                        locks.push(lock_device(&found[i].path)?);
                        c.path = found[i].path.clone();
                        leaves.push(Some(Arc::clone(&found[i].leaf)));
                    }
                    None => leaves.push(None),
                }
            }
            let top = TopVdev::open(&tc, cfg.ashift, leaves)?;
            if matches!(top.health(), TopHealth::Faulted) {
                missing_logs.extend(tc.children.iter().map(|c| c.path.display().to_string()));
            }
            logs.push(crate::logdev::LogVdev::new(Arc::new(top)));
        }
        if !missing_logs.is_empty() && !opts.discard_log {
            return Err(PoolError::Faulted(format!(
                "cannot import '{}': its log device is missing ({}) and may hold acknowledged \
                 synchronous writes; attach it, or import with --discard-log to go on without them",
                cfg.pool_name,
                missing_logs.join(", ")
            )));
        }
        // Every uberblock of every present leaf, newest first.
        let mut ubs: BTreeMap<u64, Uberblock> = BTreeMap::new();
        // Per leaf GUID: the newest txg whose uberblock it holds.
        let mut leaf_txgs: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
        for t in &tops {
            for (ci, info) in t.leaves().into_iter().enumerate() {
                let Some(leaf) = t.leaf(ci) else { continue };
                let have = leaf_txgs.entry(info.guid).or_default();
                for raw in tarn_vdev::read_uberblocks(leaf.as_ref(), cfg.ashift) {
                    if let Ok(u) = Uberblock::decode(&raw) {
                        if u.pool_guid == guid {
                            have.insert(u.txg);
                            ubs.entry(u.txg).or_insert(u);
                        }
                    }
                }
            }
        }
        let newest_seen = ubs.keys().next_back().copied().unwrap_or(0);
        let cache = opts.block_cache();
        let mut last_err = None;
        let mut loaded = None;
        // No self-heal while trying uberblocks: an older txg's blocks may
        // have been reused since, and repairing them would overwrite newer
        // data. Reads still reconstruct from redundancy.
        for t in &tops {
            t.set_self_heal(false);
        }
        for (_, ub) in ubs.iter().rev() {
            match load_txg(&tops, &cache, ub) {
                Ok(x) => {
                    loaded = Some((ub.clone(), x));
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        for t in &tops {
            t.set_self_heal(true);
        }
        let Some((ub, (meta, space, space_blocks, props, mut ms))) = loaded else {
            return Err(PoolError::Corrupt(format!(
                "pool '{}': no uberblock with a verifiable tree ({})",
                cfg.pool_name,
                last_err
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "no uberblocks found".into())
            )));
        };
        // Leaves that are absent now miss every txg from here on. A present
        // leaf whose newest uberblock is older than the loaded txg missed the
        // txgs in between (a write failed, it was replaced in, or the dirty
        // time log of its last txg never reached disk): record that, so the
        // resilver covers it. A record left open by an interrupted offline
        // is closed at what this import has seen.
        // An absent leaf may have missed the loaded txg itself (its log would
        // only have been committed with the next one): count from there.
        let loaded_txg = ub.txg;
        let next = loaded_txg;
        // Leaves the loaded uberblock names as having missed writes of its
        // txg (their log would only have been committed with the next one).
        for t in &tops {
            for l in t.leaves() {
                if ub.missed_overflow || ub.missed.contains(&l.guid) {
                    let e = ms.dtl.entry(l.guid).or_insert((loaded_txg, loaded_txg));
                    e.0 = e.0.min(loaded_txg);
                    e.1 = e.1.max(loaded_txg);
                }
            }
        }
        for t in &tops {
            for l in t.leaves() {
                if matches!(l.state, LeafState::Missing | LeafState::Offline) {
                    let e = ms.dtl.entry(l.guid).or_insert((next, u64::MAX));
                    e.0 = e.0.min(next);
                    e.1 = u64::MAX;
                    continue;
                }
                // Uberblocks above the loaded txg (a rewind) say nothing.
                let newest = leaf_txgs
                    .get(&l.guid)
                    .and_then(|t| t.range(..=loaded_txg).next_back().copied())
                    .unwrap_or(0);
                if newest < loaded_txg {
                    let e = ms.dtl.entry(l.guid).or_insert((newest + 1, loaded_txg));
                    e.0 = e.0.min(newest + 1);
                    e.1 = e.1.max(loaded_txg);
                }
                if let Some(e) = ms.dtl.get_mut(&l.guid) {
                    if e.1 == u64::MAX {
                        e.1 = newest_seen.max(e.0);
                    }
                }
            }
        }
        let pool = Arc::new(Pool::assemble(
            &name,
            guid,
            cfg.ashift,
            tops,
            opts,
            newest_seen,
            meta,
            space,
            space_blocks,
            props,
            ms,
            locks,
        ));
        {
            let mut sync = pool.sync_state();
            let mut st = pool.lock();
            st.logs = logs;
            // Frees the last commit released in memory (space map of the
            // loaded txg still shows them deferred) were free when the
            // intent log allocated its blocks: release them first.
            pool.release_frees(&mut st);
            // Before anything allocates: the intent log's blocks and the
            // data blocks it references are in use until replay commits.
            let rewound = loaded_txg < newest_seen;
            let dropped = pool.log_claim(&mut st, loaded_txg, rewound)?;
            // Committed txgs lost to damage are data lost: said where
            // `status` lists damage, not left for the user to notice.
            if rewound {
                st.ms.damaged.insert(format!(
                    "txgs {}..={}: committed, but their metadata did not verify; the pool was \
                     imported at txg {loaded_txg}, without the changes they held{}",
                    loaded_txg + 1,
                    newest_seen,
                    if dropped > 0 {
                        format!(" and without {dropped} intent log commit(s) made on top of them")
                    } else {
                        String::new()
                    }
                ));
            }
            // The labels name the new owner now; the state changes of this
            // import (dirty time logs) are committed by the first txg. Import
            // itself writes no txg, so a pool too full or fragmented to
            // commit one still imports and serves reads.
            st.ms_dirty = true;
            st.ms.config_gen += 1;
            drop(st);
            // One above everything committed, so these labels outrank the
            // ones an earlier export left on devices absent today.
            pool.write_labels_at(&mut sync, PoolState::Active, newest_seen.max(cfg.txg) + 1)?;
        }
        pool.start_syncer();
        let resume = {
            let st = pool.lock();
            pool.mark_resilver_targets(&st);
            st.ms.scan.as_ref().is_some_and(|s| s.is_running())
        };
        if resume {
            pool.spawn_scanner();
        }
        pool.start_resilver_if_needed();
        Ok(pool)
    }
}
