//! The node's API: [`Backend`] over the daemon's pools, one function per
//! method. Each runs on the calling connection's thread; it finds the pool,
//! calls the pool or dataset layer, keeps mounts and servers in step with
//! what changed, and converts the answer into the API's types (`convert`).
//! Objects (files at the top of a pool's root filesystem) are in `objects`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarn_api::access::{Share, ShareInfo, UserInfo};
use tarn_api::dataset::{DatasetInfo, MountInfo, PropValue};
use tarn_api::params::ObjectInfo;
use tarn_api::pool::{
    CreateRequest, Fault, Health, ImportRequest, ImportResult, IostatEntry, PoolListEntry,
    PoolStatus, ScanStatus, ScrubAction, VdevKind, VdevSpec,
};
use tarn_api::{ApiError, Backend};
use tarn_pool::{Pool, PoolOptions, ScanAction};

use crate::access;
use crate::convert::{
    api_error, dataset_info, ds_error, fault_to_engine, import_candidate, in_pool, iostat_entry,
    list_entry, parse_bytes, pool_status, prop_value, scan_status, vdev_kind, vol_error,
};
use crate::objects::absolute_path;
use crate::pools::{attach_datasets, pool_of, Pools};
use crate::transport::Node;

/// A volume's block size when its creator names none (ZFS's default):
/// small enough that a guest's 4K writes rewrite little, large enough
/// to compress.
const DEFAULT_VOLBLOCKSIZE: u64 = 16 << 10;

impl Backend for Pools {
    fn pool_create(&self, req: &CreateRequest) -> Result<PoolStatus, ApiError> {
        let _name = self.reserve(&req.name)?;
        let specs: Vec<tarn_pool::VdevSpec> = req
            .vdevs
            .iter()
            .map(|v| tarn_pool::VdevSpec {
                kind: vdev_kind(v.kind),
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
        let status = status_with_cache(&pool);
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
                .map(import_candidate)
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
        let status = status_with_cache(&pool);
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

    fn pool_export(&self, name: &str, force: bool) -> Result<(), ApiError> {
        let pool = self.get(name)?;
        self.unless_busy(&pool, force)?;
        self.mounts.unmount_pool(name);
        self.fss.forget_tree(name);
        let r = pool.export(false);
        self.forget(&pool);
        self.write_cache();
        self.refresh_servers();
        r.map_err(api_error)
    }

    fn pool_destroy(&self, name: &str, force: bool) -> Result<(), ApiError> {
        let pool = self.get(name)?;
        self.unless_busy(&pool, force)?;
        self.mounts.unmount_pool(name);
        self.fss.forget_tree(name);
        let r = pool.export(true);
        self.forget(&pool);
        // Its users' share links and API tokens go with them (a new pool
        // of the same name, with users of the same names, must not
        // inherit them).
        let gone = self
            .links
            .forget(name, None)
            .and_then(|()| self.api_tokens.del_scope(&format!("{name}/")))
            // Replication tokens for the pool or a dataset of it: a new
            // pool of the same name must not take streams meant for this
            // one.
            .and_then(|()| self.tokens.del_scope(name))
            .and_then(|()| self.tokens.del_scope(&format!("{name}/")));
        if let Err(e) = gone {
            log::warn!(
                "tarn: pool {name}: its users' share links or API tokens could not be removed: {}",
                e.message
            );
        }
        self.write_cache();
        self.refresh_servers();
        r.map_err(api_error)
    }

    fn pool_list(&self) -> Result<Vec<PoolListEntry>, ApiError> {
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        let mut out: Vec<PoolListEntry> =
            pools.iter().map(|p| list_entry(p.list_entry())).collect();
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
                health: Health::Unavail,
                guid: u.guid.clone(),
            });
        }
        Ok(out)
    }

    fn pool_status(&self, name: Option<&str>) -> Result<Vec<PoolStatus>, ApiError> {
        match name {
            Some(n) => Ok(vec![status_with_cache(&*self.get(n)?)]),
            None => {
                let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
                Ok(pools.iter().map(|p| status_with_cache(p)).collect())
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
        let scan = self.get(name)?.scrub(a).map_err(in_pool(name))?;
        Ok(scan.map(scan_status))
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
            VdevKind::Single => tarn_vdev::VdevKind::Single,
            VdevKind::Mirror => tarn_vdev::VdevKind::Mirror,
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
            Some(n) => Ok(self
                .get(n)?
                .iostat()
                .into_iter()
                .map(iostat_entry)
                .collect()),
            None => {
                let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
                Ok(pools
                    .iter()
                    .flat_map(|p| p.iostat())
                    .map(iostat_entry)
                    .collect())
            }
        }
    }

    fn dataset_create(&self, p: &tarn_api::params::DatasetCreateParams) -> Result<(), ApiError> {
        let pool = self.get(pool_of(&p.name))?;
        let key = crate::keys::new_root_input(&p.name, &p.properties, p.key.as_deref())?;
        tarn_dataset::create_with_key(&pool, &p.name, &p.properties, p.parents, key.as_ref())
            .map_err(ds_error)?;
        self.mounts.automount(&self.fss, &pool);
        Ok(())
    }

    fn key_load(&self, p: &tarn_api::params::KeyLoadParams) -> Result<(), ApiError> {
        let pool = self.get(pool_of(&p.name))?;
        let (format, location, _) = tarn_dataset::key_location(&pool, &p.name).map_err(ds_error)?;
        if let Some(l) = &p.location {
            tarn_dataset::crypt::check_keylocation(l).map_err(ds_error)?;
        }
        let from = p.location.as_deref().unwrap_or(&location);
        let mut key = crate::keys::input(format, from, p.key.as_deref(), &p.name)?;
        key.location = location;
        tarn_dataset::load_key_with(&pool, &p.name, &key, p.discard_log).map_err(ds_error)?;
        // Its datasets can be mounted and shared again.
        self.mounts.automount(&self.fss, &pool);
        self.refresh_servers();
        Ok(())
    }

    fn key_unload(&self, name: &str) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        tarn_dataset::key_location(&pool, name).map_err(ds_error)?;
        let users: Vec<String> = tarn_dataset::list(&pool, false)
            .map_err(ds_error)?
            .into_iter()
            .filter(|d| d.encryptionroot.as_deref() == Some(name))
            .map(|d| d.name)
            .collect();
        // What uses the key goes down first: mounts, deepest first (a busy
        // one stops the unload), then the filesystems and volumes the
        // servers hold.
        let _resizes = tarn_vol::resize_lock();
        let mut mounted: Vec<String> = self
            .mounts
            .list()
            .into_iter()
            .map(|m| m.dataset)
            .filter(|m| {
                users
                    .iter()
                    .any(|u| m == u || m.starts_with(&format!("{u}@")))
            })
            .collect();
        mounted.sort_by_key(|m| std::cmp::Reverse(m.len()));
        let r = {
            // No refresh may mount a share of these datasets again between
            // taking it down and the key going.
            let _serving = self.serve_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.take_down_and_unload(&pool, name, &users, mounted)
        };
        // Samba's shares come back if the unload failed, and are listed as
        // problems (locked) if it worked.
        self.refresh_servers();
        r
    }

    fn key_change(&self, p: &tarn_api::params::KeyChangeParams) -> Result<(), ApiError> {
        let pool = self.get(pool_of(&p.name))?;
        let (format, location, _) = tarn_dataset::key_location(&pool, &p.name).map_err(ds_error)?;
        let format = match &p.keyformat {
            Some(f) => tarn_dataset::KeyFormat::parse(f).map_err(ds_error)?,
            None => format,
        };
        let location = p.keylocation.clone().unwrap_or(location);
        tarn_dataset::crypt::check_keylocation(&location).map_err(ds_error)?;
        let key = crate::keys::input(format, &location, p.key.as_deref(), &p.name)?;
        tarn_dataset::change_key(&pool, &p.name, &key).map_err(ds_error)
    }

    fn dataset_send(
        &self,
        p: &tarn_api::params::SendParams,
        out: &mut dyn std::io::Write,
    ) -> Result<tarn_api::params::SendResult, ApiError> {
        let opts = tarn_send::SendOptions {
            from: p.from.clone(),
            intermediates: p.intermediates,
            raw: p.raw,
            props: p.props,
            token: p.token.clone(),
            replicate: p.replicate,
        };
        // A token names its snapshot by guid: the pool that holds it, the
        // one of the token's own dataset first (a copy of the snapshot in
        // another pool has the same guid, not necessarily its history).
        let (pool, snap) = match (&p.snapshot, &p.token) {
            (Some(s), _) => (self.get(pool_of(s))?, s.clone()),
            (None, Some(t)) => {
                let token = tarn_dataset::recv::Token::parse(t).map_err(ds_error)?;
                let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
                let mut found = None;
                for pool in pools {
                    let of = &token.source;
                    if let Ok(Some(name)) =
                        tarn_dataset::recv::snapshot_by_guid(&pool, token.guid, of)
                    {
                        if tarn_dataset::recv::dataset_of(&name) == of {
                            found = Some((pool, name));
                            break;
                        }
                        found.get_or_insert((pool, name));
                    }
                }
                found.ok_or_else(|| {
                    ApiError::not_found(format!(
                        "no pool here holds the token's snapshot {}@{}",
                        token.source, token.name
                    ))
                })?
            }
            (None, None) => return Err(ApiError::invalid("name a snapshot to send, or a token")),
        };
        let r = tarn_send::send(&pool, &snap, &opts, out).map_err(send_error)?;
        Ok(tarn_api::params::SendResult {
            streams: r.streams,
            bytes: r.bytes,
            items: r.stats.items,
            blocks_read: r.stats.blocks_read,
        })
    }

    fn dataset_receive(
        &self,
        p: &tarn_api::params::ReceiveParams,
        input: &mut dyn std::io::Read,
    ) -> Result<tarn_api::params::ReceiveResult, ApiError> {
        let pool = self.get(pool_of(&p.name))?;
        // One receive at a time into a tree: a second one (a sender that
        // reconnected before the first noticed the cut) would apply the
        // same partial state twice over.
        let _receiving = self.receiving(&p.name)?;
        // The stream replaces what an existing target shows: its mounts
        // and open filesystems go down first, and come back after. The
        // lock that orders tree replacements is not held while the stream
        // arrives (hours, from a slow sender): a dataset being received
        // refuses to be opened meanwhile, and the receive's own changes
        // of the tree are single transactions.
        let down = {
            let _resizes = tarn_vol::resize_lock();
            let down = self.mounts.unmount_tree(&p.name)?;
            self.fss.forget_tree(&p.name);
            down
        };
        let opts = tarn_dataset::recv::RecvOptions {
            force: p.force,
            resumable: p.resumable,
            exclude: &p.exclude,
            allow: p.props_allowed.as_deref(),
            keep_wrapping: p.keep_wrapping,
        };
        let r = tarn_send::receive(&pool, &p.name, opts, input).map_err(send_error);
        let _resizes = tarn_vol::resize_lock();
        if p.force {
            // Its rollback destroyed the snapshots after the base (even
            // when the stream then failed).
            self.forget_shares_of_destroyed(&pool, &p.name);
        }
        self.mounts.remount(&self.fss, &pool, down, None);
        if !p.no_mount {
            self.mounts.automount(&self.fss, &pool);
        }
        self.refresh_servers();
        let r = r?;
        Ok(tarn_api::params::ReceiveResult {
            snapshots: r.snapshots,
            skipped: r.skipped,
            items: r.items,
        })
    }

    fn dataset_receive_abort(&self, name: &str) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        // Not while a receive into it runs: that one would go on writing.
        let _receiving = self.receiving(name)?;
        tarn_dataset::recv::abort(&pool, name).map_err(ds_error)?;
        self.refresh_servers();
        Ok(())
    }

    fn replication_token_add(
        &self,
        label: &str,
        dataset: &str,
    ) -> Result<tarn_api::params::TokenAdded, ApiError> {
        // Bound to the pool as it is now: another pool made or imported
        // under its name later is not what the token was given for.
        let pool = dataset.split('/').next().unwrap_or(dataset);
        let guid = self.get(pool).map(|p| p.guid()).map_err(|_| {
            ApiError::not_found(format!(
                "no pool '{pool}': a replication token is for a dataset of a pool this daemon has"
            ))
        })?;
        self.tokens.add_bound(label, dataset, Some(guid))
    }

    fn replication_token_list(&self) -> Result<Vec<tarn_api::params::TokenInfo>, ApiError> {
        self.tokens.list()
    }

    fn replication_token_del(&self, label: &str) -> Result<(), ApiError> {
        self.tokens.del(label)
    }

    fn replication_info(&self) -> Result<tarn_api::params::ReplicationInfo, ApiError> {
        let r = self.replication.lock().unwrap_or_else(|e| e.into_inner());
        Ok(tarn_api::params::ReplicationInfo {
            listen: r.as_ref().map(|r| r.addr().to_string()),
            fingerprint: r.as_ref().map(|r| r.fingerprint().to_string()),
        })
    }

    fn key_list(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<tarn_api::dataset::KeyRootInfo>, ApiError> {
        let pools: Vec<Arc<Pool>> = match name {
            Some(n) => vec![self.get(pool_of(n))?],
            None => self.lock().values().cloned().collect(),
        };
        let mut out = Vec::new();
        for p in pools {
            let roots = tarn_dataset::encryption_roots(&p, name).map_err(ds_error)?;
            out.extend(roots.into_iter().map(|(name, loaded, format, location)| {
                tarn_api::dataset::KeyRootInfo {
                    name,
                    keystatus: if loaded { "available" } else { "unavailable" }.into(),
                    keyformat: format.name().into(),
                    keylocation: location,
                }
            }));
        }
        Ok(out)
    }

    fn dataset_destroy(&self, name: &str, recursive: bool) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        // A mistyped name must not close the volumes VMs are using (a
        // range `fs@a%b` is checked by the destroy itself).
        if !name.contains('%') {
            tarn_dataset::open(&pool, name).map_err(ds_error)?;
        }
        // A destroy that would be refused takes nothing down: its mounts'
        // and volume's clients stay connected.
        tarn_dataset::check_destroy(&pool, name, recursive).map_err(ds_error)?;
        // No volume resize may run between closing a volume and this.
        let _resizes = tarn_vol::resize_lock();
        // What goes away is unmounted first; a busy mount stops the destroy.
        let (fs, snap) = name.split_once('@').unwrap_or((name, ""));
        // One snapshot takes down only what serves it (a prune must not
        // cut the readers of the snapshots that stay); a range, every
        // snapshot of the filesystem.
        let one_snapshot = !snap.is_empty() && !snap.contains('%');
        let gone = if snap.is_empty() {
            self.mounts.unmount_tree(fs)?
        } else if one_snapshot {
            self.mounts.unmount_tree(name)?
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
        } else if one_snapshot {
            self.fss.forget_one(name);
        } else {
            self.fss.forget_snapshots(fs);
        }
        let r = tarn_dataset::destroy(&pool, name, recursive).map_err(ds_error);
        if r.is_err() {
            self.mounts.remount(&self.fss, &pool, gone, None);
            self.mounts.automount(&self.fss, &pool);
        } else {
            self.forget_shares_of_destroyed(&pool, name);
        }
        self.refresh_servers();
        r
    }

    fn dataset_list(&self, snapshots: bool) -> Result<Vec<DatasetInfo>, ApiError> {
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        let mut out = Vec::new();
        for p in pools {
            match tarn_dataset::list(&p, snapshots) {
                Ok(l) => out.extend(l.into_iter().map(dataset_info)),
                Err(e) => log::warn!("tarn: pool '{}': cannot list datasets: {e}", p.name()),
            }
        }
        Ok(out)
    }

    fn dataset_get(&self, name: &str, properties: &[String]) -> Result<Vec<PropValue>, ApiError> {
        let pool = self.get(pool_of(name))?;
        let props = tarn_dataset::get_props(&pool, name, properties).map_err(ds_error)?;
        Ok(props.into_iter().map(prop_value).collect())
    }

    fn volume_create(&self, p: &tarn_api::params::VolumeCreateParams) -> Result<(), ApiError> {
        let pool = self.get(pool_of(&p.name))?;
        let size = parse_bytes("size", &p.size)?;
        let block = match &p.block_size {
            Some(b) => parse_bytes("volblocksize", b)?,
            None => DEFAULT_VOLBLOCKSIZE,
        };
        let block = u32::try_from(block)
            .map_err(|_| ApiError::invalid(format!("volblocksize {block} is too large")))?;
        let spec = tarn_dataset::VolSpec { size, block };
        let key = crate::keys::new_root_input(&p.name, &p.properties, p.key.as_deref())?;
        tarn_dataset::create_volume_with_key(
            &pool,
            &p.name,
            spec,
            p.sparse,
            &p.properties,
            p.parents,
            key.as_ref(),
        )
        .map_err(ds_error)?;
        // Parents made with -p are filesystems that may have mountpoints.
        self.mounts.automount(&self.fss, &pool);
        Ok(())
    }

    fn volume_resize(&self, name: &str, size: &str, force: bool) -> Result<(), ApiError> {
        let pool = self.get(pool_of(name))?;
        let size = parse_bytes("size", size)?;
        self.fss
            .volume(&pool, name)?
            .resize(size, force)
            .map_err(vol_error)
    }

    fn dataset_set(&self, name: &str, property: &str, value: &str) -> Result<(), ApiError> {
        if property == "volsize" {
            return self.volume_resize(name, value, false);
        }
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
        // Checked before anything is taken down: a mistyped name must not
        // close the volumes that VMs are using.
        tarn_dataset::open(&pool, name).map_err(ds_error)?;
        if tarn_dataset::open(&pool, new_name).is_ok() {
            return Err(ApiError::exists(format!(
                "dataset '{new_name}' already exists"
            )));
        }
        tarn_dataset::check_rename(&pool, name, new_name).map_err(ds_error)?;
        let _resizes = tarn_vol::resize_lock();
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
        if r.is_ok() {
            let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = access::shares_follow_rename(&pool, name, new_name) {
                log::warn!(
                    "tarn: pool '{}': the shares of '{name}' still name it after its rename \
                     to '{new_name}': {e}",
                    pool.name()
                );
            }
            drop(_access);
            let _schedules = self.schedule_lock.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = crate::schedule::follow_rename(&pool, name, new_name) {
                log::warn!(
                    "tarn: pool '{}': the schedules of '{name}' still name it after its \
                     rename to '{new_name}': {e}",
                    pool.name()
                );
            }
        }
        let renamed = r.is_ok().then_some((name, new_name));
        self.mounts.remount(&self.fss, &pool, down, renamed);
        self.mounts.automount(&self.fss, &pool);
        self.refresh_servers();
        r
    }

    fn dataset_hold(&self, tag: &str, snaps: &[String], recursive: bool) -> Result<(), ApiError> {
        let pool = self.get(one_pool(snaps)?)?;
        tarn_dataset::hold(&pool, tag, snaps, recursive).map_err(ds_error)
    }

    fn dataset_release(
        &self,
        tag: &str,
        snaps: &[String],
        recursive: bool,
    ) -> Result<(), ApiError> {
        let pool = self.get(one_pool(snaps)?)?;
        tarn_dataset::release(&pool, tag, snaps, recursive).map_err(ds_error)
    }

    fn dataset_holds(
        &self,
        snaps: &[String],
        recursive: bool,
    ) -> Result<Vec<tarn_api::dataset::HoldInfo>, ApiError> {
        let pool = self.get(one_pool(snaps)?)?;
        let holds = tarn_dataset::holds(&pool, snaps, recursive).map_err(ds_error)?;
        Ok(holds
            .into_iter()
            .map(|(snapshot, tag)| tarn_api::dataset::HoldInfo { snapshot, tag })
            .collect())
    }

    fn dataset_snapshot(&self, names: &[String], recursive: bool) -> Result<(), ApiError> {
        let pool = self.get(one_pool(names)?)?;
        tarn_dataset::snapshot(&pool, names, recursive).map_err(ds_error)
    }

    fn dataset_rollback(&self, snapshot: &str, destroy_newer: bool) -> Result<(), ApiError> {
        let pool = self.get(pool_of(snapshot))?;
        // The tree changes under the filesystem: take its mount (and those
        // inside it) down and bring them back after.
        let fs = snapshot.split('@').next().unwrap_or(snapshot);
        // Checked before anything is taken down (see rename).
        if !tarn_dataset::open(&pool, snapshot)
            .map_err(ds_error)?
            .is_snapshot()
        {
            return Err(ApiError::invalid(format!("'{snapshot}' is not a snapshot")));
        }
        tarn_dataset::check_rollback(&pool, snapshot, destroy_newer).map_err(ds_error)?;
        let _resizes = tarn_vol::resize_lock();
        let down = self.mounts.unmount_tree(fs)?;
        let r = {
            // No refresh may open the volume again (for its clients to
            // reconnect and write to) between closing it and the rollback:
            // that one would not be closed after it, and would serve the
            // rolled-back blocks to clients never told.
            let _serving = self.serve_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.fss.forget_tree(fs);
            tarn_dataset::rollback(&pool, snapshot, destroy_newer).map_err(ds_error)
        };
        if r.is_ok() && destroy_newer {
            self.forget_shares_of_destroyed(&pool, fs);
        }
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
        fault: Option<Fault>,
    ) -> Result<Vec<Fault>, ApiError> {
        let what = fault
            .as_ref()
            .map(|f| format!("{} ({:.0}%)", f.kind.name(), f.probability * 100.0))
            .unwrap_or_else(|| "no faults".into());
        let r = self
            .get(name)?
            .inject(device, fault.map(fault_to_engine))
            .map_err(in_pool(name))?;
        log::warn!("tarn: drill: pool '{name}' device {device}: {what}");
        Ok(r.into_iter().map(crate::convert::fault).collect())
    }

    fn user_add(
        &self,
        pool: Option<&str>,
        name: &str,
        password: &str,
        uid: Option<u32>,
        gid: Option<u32>,
        smb: bool,
    ) -> Result<UserInfo, ApiError> {
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.pool_for_users(pool)?;
        let info = access::user_add(&p, name, password, uid, gid, smb)?;
        // Samba's account and password files follow the users.
        self.refresh_servers();
        Ok(info)
    }

    fn user_del(&self, pool: Option<&str>, name: &str) -> Result<(), ApiError> {
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.pool_for_users(pool)?;
        access::user_del(&p, name)?;
        // Its API tokens and share links go with it.
        self.api_tokens.del_scope(&format!("{}/{name}", p.name()))?;
        self.links.forget(p.name(), Some(name))?;
        self.refresh_servers();
        Ok(())
    }

    fn user_passwd(
        &self,
        pool: Option<&str>,
        name: &str,
        password: &str,
        smb: Option<bool>,
    ) -> Result<(), ApiError> {
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.pool_for_users(pool)?;
        access::user_passwd(&p, name, password, smb)?;
        self.refresh_servers();
        Ok(())
    }

    fn user_chap(
        &self,
        pool: Option<&str>,
        name: &str,
        secret: Option<&str>,
    ) -> Result<(), ApiError> {
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.pool_for_users(pool)?;
        access::user_chap(&p, name, secret)?;
        // Targets that log in with this user's secret take the new one.
        self.refresh_servers();
        Ok(())
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
                    chap: u.chap_secret.is_some(),
                    smb: u.nt_hash.is_some(),
                    admin: u.admin_node.as_deref() == Some(self.node_id.as_str()),
                });
            }
        }
        Ok(out)
    }

    fn user_admin(&self, pool: Option<&str>, name: &str, admin: bool) -> Result<(), ApiError> {
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.pool_for_users(pool)?;
        access::user_admin(&p, name, admin, &self.node_id)
    }

    fn api_token_add(
        &self,
        label: &str,
        user: &str,
        pool: Option<&str>,
    ) -> Result<tarn_api::params::TokenAdded, ApiError> {
        let holders: Vec<String> = self
            .all_pools()
            .iter()
            .filter(|p| pool.is_none_or(|want| p.name() == want))
            .filter(|p| access::user(p, user).is_ok())
            .map(|p| p.name().to_string())
            .collect();
        match holders.as_slice() {
            [one] => {
                let guid = self.get(one)?.guid();
                self.api_tokens
                    .add_bound(label, &format!("{one}/{user}"), Some(guid))
            }
            [] => Err(ApiError::not_found(format!("no user '{user}'"))),
            _ => Err(ApiError::invalid(format!(
                "pools {} each have a user '{user}': give --pool",
                holders.join(", ")
            ))),
        }
    }

    fn api_token_list(&self) -> Result<Vec<tarn_api::params::ApiTokenInfo>, ApiError> {
        Ok(self
            .api_tokens
            .list()?
            .into_iter()
            .map(|t| {
                let (pool, user) = t.dataset.split_once('/').unwrap_or(("", &t.dataset));
                tarn_api::params::ApiTokenInfo {
                    label: t.label.clone(),
                    user: user.to_string(),
                    pool: pool.to_string(),
                    created_unix: t.created_unix,
                }
            })
            .collect())
    }

    fn api_token_del(&self, label: &str) -> Result<(), ApiError> {
        self.api_tokens.del(label)
    }

    fn link_create(
        &self,
        p: &tarn_api::params::LinkCreateParams,
    ) -> Result<tarn_api::params::LinkCreated, ApiError> {
        let owner = p
            .owner
            .as_deref()
            .ok_or_else(|| ApiError::invalid("owner: POOL/USER, the user the link acts as"))?;
        let (pool, name) = owner
            .split_once('/')
            .ok_or_else(|| ApiError::invalid("owner: POOL/USER, the user the link acts as"))?;
        let user = tarn_web::UserId {
            pool: pool.to_string(),
            name: name.to_string(),
        };
        let share = crate::web::file_shares(self, &user)
            .into_iter()
            .find(|s| s.name == p.share)
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "user '{name}' of pool '{pool}' has no share '{}' of files",
                    p.share
                ))
            })?;
        if p.upload && !share.writable {
            return Err(ApiError::new(
                tarn_api::ErrorCode::Forbidden,
                "an upload link needs write access to the share",
            ));
        }
        crate::web::folder_of(&share, &crate::links::check_path(&p.path)?)?;
        let guid = self.get(pool)?.guid();
        self.links.create(pool, Some(guid), name, p)
    }

    fn link_list(&self) -> Result<Vec<tarn_api::params::LinkInfo>, ApiError> {
        self.links.list()
    }

    fn link_revoke(&self, id: &str) -> Result<(), ApiError> {
        self.links.revoke(id)
    }

    fn stats_history(&self, day: bool) -> Result<Vec<tarn_api::params::HistoryPoint>, ApiError> {
        match self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(h) => Ok(h.points(day)),
            None => Err(ApiError::busy("the history is not sampled yet")),
        }
    }

    fn share_add(&self, share: &Share, owner: Option<&str>) -> Result<(), ApiError> {
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        let pool = self.get(pool_of(&share.dataset))?;
        if owner.is_some() && share.nfs.is_none() && share.webdav.is_none() && share.smb.is_none() {
            return Err(ApiError::invalid(
                "--owner gives a filesystem's top folder to a user; a volume has none",
            ));
        }
        let mut share = share.clone();
        if let Some(i) = share.iscsi.as_mut().filter(|i| i.iqn.is_empty()) {
            i.iqn = access::default_iqn(pool.name(), &share.name);
        }
        let share = &share;
        // One name per node: it is the NFS path, the WebDAV folder and the
        // NBD export name, which every pool's shares are served under; and
        // one iSCSI target name per node.
        // (A pool whose shares cannot be read is left out here; serving
        // then keeps the first share of a name and logs the others.)
        let others: Vec<Arc<Pool>> = self
            .lock()
            .values()
            .filter(|p| p.name() != pool.name())
            .cloned()
            .collect();
        for other in others {
            let Ok(theirs) = access::shares(&other) else {
                continue;
            };
            if theirs.iter().any(|s| s.name == share.name) {
                return Err(ApiError::exists(format!(
                    "pool '{}' already has a share named '{}'",
                    other.name(),
                    share.name
                )));
            }
            // Samba finds shares by name without case, across pools too.
            if share.smb.is_some() {
                if let Some(s) = theirs
                    .iter()
                    .find(|s| s.smb.is_some() && s.name.eq_ignore_ascii_case(&share.name))
                {
                    return Err(ApiError::exists(format!(
                        "share '{}' of pool '{}' is served over SMB already, and SMB share \
                         names do not differ by case",
                        s.name,
                        other.name()
                    )));
                }
            }
            if let Some(i) = &share.iscsi {
                if let Some(s) = theirs
                    .iter()
                    .find(|s| s.iscsi.as_ref().is_some_and(|o| o.iqn == i.iqn))
                {
                    return Err(ApiError::exists(format!(
                        "share '{}' of pool '{}' already serves the iSCSI target {}",
                        s.name,
                        other.name(),
                        i.iqn
                    )));
                }
            }
        }
        let owner = match owner {
            None => None,
            Some(name) => Some(access::user(&pool, name)?),
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
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        let found: Vec<Arc<Pool>> = match pool {
            Some(p) => vec![self.get(p)?],
            None => {
                let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
                let mut hits = Vec::new();
                for p in pools {
                    // A damaged record can be removed by name too.
                    let stored = access::stored_shares(&p)?;
                    if stored.shares.iter().any(|s| s.name == name)
                        || stored.damaged.iter().any(|d| d.name == name)
                    {
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
            let stored = access::stored_shares(&p)?;
            for s in stored.shares {
                out.push(ShareInfo {
                    pool: p.name().to_string(),
                    share: s,
                    damaged: None,
                });
            }
            for d in stored.damaged {
                out.push(ShareInfo {
                    pool: p.name().to_string(),
                    share: Share {
                        name: d.name,
                        dataset: String::new(),
                        nfs: None,
                        webdav: None,
                        nbd: None,
                        iscsi: None,
                        smb: None,
                    },
                    damaged: Some(d.error),
                });
            }
        }
        Ok(out)
    }

    fn disk_list(&self) -> Result<Vec<tarn_api::health::DiskHealth>, ApiError> {
        Ok(self
            .devices()
            .into_iter()
            .map(|(d, p)| crate::health::read(&d, &p))
            .collect())
    }

    fn disk_health(&self, device: &str) -> Result<tarn_api::health::DiskHealth, ApiError> {
        let (d, p) = self.pool_device(device)?;
        Ok(crate::health::read(&d, &p))
    }

    fn disk_selftest(&self, device: &str, test: &str) -> Result<String, ApiError> {
        let (d, _) = self.pool_device(device)?;
        crate::health::self_test(&d, test).map_err(ApiError::invalid)
    }

    fn events_list(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<tarn_api::events::Event>, ApiError> {
        Ok(self.events.list(after, limit))
    }

    fn alert_add(&self, alert: &tarn_api::events::Alert) -> Result<(), ApiError> {
        self.events.alert_add(alert)
    }

    fn alert_del(&self, name: &str) -> Result<(), ApiError> {
        self.events.alert_del(name)
    }

    fn alert_list(&self) -> Result<Vec<tarn_api::events::AlertInfo>, ApiError> {
        Ok(self.events.alert_list())
    }

    fn alert_test(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<tarn_api::events::AlertTestResult>, ApiError> {
        self.events.alert_test(name)
    }

    fn schedule_add(&self, schedule: &tarn_api::schedule::Schedule) -> Result<(), ApiError> {
        let _runs = self.schedule_lock.lock().unwrap_or_else(|e| e.into_inner());
        let pool = self.get(&schedule.pool)?;
        crate::schedule::put(&pool, schedule, crate::schedule::clock(), &self.node_id)
    }

    fn schedule_del(&self, pool: Option<&str>, name: &str) -> Result<(), ApiError> {
        let _runs = self.schedule_lock.lock().unwrap_or_else(|e| e.into_inner());
        let (pool, _) = self.find_schedule(pool, name)?;
        crate::schedule::del(&pool, name)
    }

    fn schedule_list(&self) -> Result<Vec<tarn_api::schedule::ScheduleInfo>, ApiError> {
        let now = crate::schedule::clock();
        let mut out = Vec::new();
        for pool in self.all_pools() {
            for (rec, st) in crate::schedule::stored(&pool)? {
                out.extend(crate::schedule::info(pool.name(), &rec, &st, now));
            }
        }
        Ok(out)
    }

    fn schedule_run(
        &self,
        pool: Option<&str>,
        name: &str,
    ) -> Result<tarn_api::schedule::RunRecord, ApiError> {
        let (pool, rec) = self.find_schedule(pool, name)?;
        let r = crate::schedule::run_now(self, &pool, &rec, crate::schedule::clock())?;
        Ok(tarn_api::schedule::RunRecord {
            started_unix: r.started_unix,
            ok: r.ok,
            detail: r.detail,
        })
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

    fn daemon_stats(&self) -> Result<tarn_api::params::DaemonStats, ApiError> {
        Ok(self.servers.stats())
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
        self.copy_file_into_object(pool, object, from_path, offset, sync)
    }

    fn object_read(&self, pool: &str, object: &str, to_path: &str) -> Result<ObjectInfo, ApiError> {
        self.copy_object_into_file(pool, object, to_path)
    }

    fn object_list(&self, pool: &str) -> Result<Vec<ObjectInfo>, ApiError> {
        self.list_objects(pool)
    }

    fn object_delete(&self, pool: &str, object: &str) -> Result<(), ApiError> {
        self.delete_object(pool, object)
    }
}

impl Node for Pools {
    fn shutdown(&self) -> Vec<String> {
        if let Some(m) = self
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            m.stop();
        }
        if let Some(w) = self.web.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.stop();
        }
        if let Some(h) = self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.stop();
        }
        if let Some(s) = self
            .scheduler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            s.stop();
        }
        if let Some(mut r) = self
            .replication
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            r.stop();
        }
        self.servers.stop();
        self.mounts.unmount_all();
        let pools: Vec<Arc<Pool>> = self.lock().values().cloned().collect();
        let mut failures = Vec::new();
        for p in pools {
            if let Err(e) = p.export(false) {
                log::warn!("tarn: exporting pool '{}': {e}", p.name());
                failures.push(format!("pool '{}' was not exported: {e}", p.name()));
            }
        }
        // The cache keeps listing them: they come back at the next start.
        // A stop that failed to export a pool is not clean: the next start
        // says so (`daemon.crashed`), as it would after a crash.
        if failures.is_empty() {
            self.events.close();
        }
        failures
    }
}

/// Maps a send or receive error onto the API's codes.
fn send_error(e: tarn_send::SendError) -> ApiError {
    match e {
        tarn_send::SendError::Dataset(d) => ds_error(d),
        tarn_send::SendError::Stream(m) => ApiError::invalid(format!("bad stream: {m}")),
        tarn_send::SendError::Io(e) => ApiError::io(format!("the stream: {e}")),
    }
}

/// A pool's status with the counters of the block cache it reads through.
fn status_with_cache(p: &Pool) -> PoolStatus {
    let mut s = pool_status(p.status());
    s.cache = Some(crate::convert::cache_counters(p.cache_stats()));
    // Encrypted datasets whose key is not loaded.
    if let Ok(list) = tarn_dataset::list(p, false) {
        s.locked = list
            .into_iter()
            .filter(|d| d.keystatus.as_deref() == Some("unavailable"))
            .map(|d| d.name)
            .collect();
    }
    s
}

/// The pool every one of `names` is in: operations on several snapshots
/// run in one txg of one pool.
fn one_pool(names: &[String]) -> Result<&str, ApiError> {
    let first = pool_of(names.first().map(String::as_str).unwrap_or(""));
    if names.iter().any(|n| pool_of(n) != first) {
        return Err(ApiError::invalid(
            "snapshots named together must be in one pool",
        ));
    }
    Ok(first)
}

/// A receive in progress into a dataset (see [`Pools::receiving`]).
pub(crate) struct Receiving<'a> {
    pools: &'a Pools,
    name: String,
}

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        self.pools
            .receives
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.name);
    }
}

impl Pools {
    /// Removes the shares of what an operation on `name` destroyed (a
    /// destroy, a rollback's newer snapshots, a forced receive's), so a
    /// dataset made later under the same name is not served on the old
    /// terms; logs what it removed.
    fn forget_shares_of_destroyed(&self, pool: &Pool, name: &str) {
        let _access = self.access_lock.lock().unwrap_or_else(|e| e.into_inner());
        match access::shares_of_destroyed(pool, name) {
            Ok(shares) => {
                for s in shares {
                    log::info!("tarn: removed share '{s}': its dataset was destroyed");
                }
            }
            Err(e) => log::warn!(
                "tarn: pool '{}': cannot remove the shares of what went with '{name}': {e}",
                pool.name()
            ),
        }
    }

    /// Before an export or destroy without `force`: unmounts the pool's
    /// filesystems unless one is in use, and then refuses with everything
    /// mounted again, as `zpool export` does without -f. With `force`
    /// nothing is checked: busy mounts are detached.
    fn unless_busy(&self, pool: &Arc<Pool>, force: bool) -> Result<(), ApiError> {
        if force {
            return Ok(());
        }
        let r = self
            .mounts
            .unmount_tree_or_none(&self.fss, pool, pool.name());
        r.map(|_| ()).map_err(|e| {
            // What the file sharing servers had taken down comes back.
            self.refresh_servers();
            ApiError::busy(format!(
                "pool '{}' is in use: {} (-f detaches what is in use)",
                pool.name(),
                e.message
            ))
        })
    }

    /// (device, pool) of a device of an imported pool, by its path (or
    /// the path it resolves to).
    fn pool_device(&self, device: &str) -> Result<(String, String), ApiError> {
        let canon = std::fs::canonicalize(device).ok();
        self.devices()
            .into_iter()
            .find(|(d, _)| d == device || canon.is_some() && std::fs::canonicalize(d).ok() == canon)
            .ok_or_else(|| {
                ApiError::not_found(format!("{device} is not a device of an imported pool"))
            })
    }

    /// The pool and stored record of schedule `name` (in `pool`, or the one
    /// pool that has a schedule of that name).
    fn find_schedule(
        &self,
        pool: Option<&str>,
        name: &str,
    ) -> Result<(Arc<Pool>, crate::schedule::ScheduleRecord), ApiError> {
        let pools = match pool {
            Some(p) => vec![self.get(p)?],
            None => self.all_pools(),
        };
        let mut found = Vec::new();
        for p in pools {
            if let Some((rec, _)) = crate::schedule::stored(&p)?
                .into_iter()
                .find(|(r, _)| r.name == name)
            {
                found.push((p, rec));
            }
        }
        match found.len() {
            0 => Err(ApiError::not_found(format!("no schedule '{name}'"))),
            1 => Ok(found.remove(0)),
            _ => Err(ApiError::invalid(format!(
                "several pools have a schedule '{name}': say which with --pool"
            ))),
        }
    }

    /// `key_unload`'s work under the serve lock: takes down what uses the
    /// key (Samba's service mounts, then the FUSE mounts `mounted`,
    /// deepest first), forgets the filesystems of `users` and unloads the
    /// key of `name`. A busy mount or a failed unload mounts the FUSE
    /// mounts again (Samba's come back with the next refresh).
    fn take_down_and_unload(
        &self,
        pool: &Arc<Pool>,
        name: &str,
        users: &[String],
        mounted: Vec<String>,
    ) -> Result<(), ApiError> {
        self.mounts.service_unmount_datasets(users)?;
        let mut down = Vec::new();
        for m in mounted {
            match self.mounts.unmount(&m) {
                Ok(info) => down.push(info),
                Err(e) => {
                    self.mounts.remount(&self.fss, pool, down, None);
                    return Err(e);
                }
            }
        }
        for u in users {
            self.fss.forget_one(u);
        }
        let r = tarn_dataset::unload_key(pool, name).map_err(ds_error);
        if r.is_err() {
            self.mounts.remount(&self.fss, pool, down, None);
        } else if let Some(w) = self.web.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            // Pictures of the plaintext, as the block cache it just
            // dropped held the plaintext itself.
            w.forget_thumbnails();
        }
        r
    }

    /// Marks a receive into `name` as running; busy when one into it, or
    /// into a dataset above or below it, runs already.
    pub(crate) fn receiving(&self, name: &str) -> Result<Receiving<'_>, ApiError> {
        let mut r = self.receives.lock().unwrap_or_else(|e| e.into_inner());
        let related = |a: &str, b: &str| {
            a == b
                || a.strip_prefix(b).is_some_and(|x| x.starts_with('/'))
                || b.strip_prefix(a).is_some_and(|x| x.starts_with('/'))
        };
        if let Some(other) = r.iter().find(|o| related(o, name)) {
            return Err(ApiError::busy(format!(
                "a receive into '{other}' is running; try again when it ends"
            )));
        }
        r.insert(name.to_string());
        Ok(Receiving {
            pools: self,
            name: name.to_string(),
        })
    }
}
