//! From the engine's types to the API's, and from the engine's errors to
//! [`ApiError`]s: the one place where the daemon translates.
//!
//! The API keeps its own copies of what the pool and dataset layers report
//! (see `tarn-api`), so the engine can change its types without changing
//! the wire format, and clients need not link the engine. Every conversion
//! here is field by field; the tests below check that an engine value and
//! its conversion serialize to the same JSON.

use tarn_api::dataset as api_ds;
use tarn_api::pool as api;
use tarn_api::{ApiError, ErrorCode};
use tarn_dataset::DsError;
use tarn_fuse::FuseError;
use tarn_pool::status as eng;
use tarn_pool::PoolError;

/// A network server's connection counters as `daemon.stats` reports them.
pub fn conn_counters(s: tarn_nfs::ConnStats) -> tarn_api::params::ConnCounters {
    tarn_api::params::ConnCounters {
        open: s.open,
        accepted: s.accepted,
        refused_per_address: s.refused_per_address,
        refused_full: s.refused_full,
        refused_unlisted: s.refused_unlisted,
        evicted: s.evicted,
        idle_closed: s.idle_closed,
        request_timeouts: 0,
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
pub fn in_pool(pool: &str) -> impl Fn(PoolError) -> ApiError + '_ {
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

/// Maps dataset-layer errors onto the API's codes.
pub fn ds_error(e: DsError) -> ApiError {
    match e {
        DsError::NotFound(m) => ApiError::not_found(m),
        DsError::Exists(m) => ApiError::exists(m),
        DsError::Busy(m) => ApiError::busy(m),
        DsError::Damaged(_) | DsError::Corrupt(_) => ApiError::damaged(e.to_string()),
        DsError::Locked(m) => ApiError::new(ErrorCode::Locked, m),
        DsError::WrongKey(m) => ApiError::new(ErrorCode::WrongKey, m),
        DsError::Pool(p) => api_error(p),
        other => ApiError::invalid(other.to_string()),
    }
}

/// Maps a volume's error onto the API's codes.
pub fn vol_error(e: tarn_vol::VolError) -> ApiError {
    use tarn_vol::VolError as V;
    match e {
        V::Damaged(_) => ApiError::damaged(e.to_string()),
        V::Other(_) => ApiError::io(e.to_string()),
        _ => ApiError::invalid(e.to_string()),
    }
}

/// A size in bytes as the API takes it: a number, or with a K/M/G/T
/// suffix (`100G`); `what` names it in the error.
pub fn parse_bytes(what: &str, s: &str) -> Result<u64, ApiError> {
    tarn_pool::parse_size(s).ok_or_else(|| {
        ApiError::invalid(format!(
            "{what} '{s}' is not a size: give bytes or a number with K, M, G or T"
        ))
    })
}

/// Maps a FUSE mount error onto the API's codes, with what to do.
pub fn fuse_error(e: FuseError) -> ApiError {
    match e {
        FuseError::Busy { .. } => ApiError::busy(format!(
            "{e}: close the files and leave the directories under it, then retry"
        )),
        FuseError::Mountpoint { .. } | FuseError::InvalidOption(_) => {
            ApiError::invalid(e.to_string())
        }
        other => ApiError::io(other.to_string()),
    }
}

/// A health word.
pub fn health(h: eng::Health) -> api::Health {
    match h {
        eng::Health::Online => api::Health::Online,
        eng::Health::Degraded => api::Health::Degraded,
        eng::Health::Faulted => api::Health::Faulted,
        eng::Health::Offline => api::Health::Offline,
        eng::Health::Unavail => api::Health::Unavail,
    }
}

/// A device's counters.
pub fn counters(c: eng::Counters) -> api::Counters {
    api::Counters {
        read_errors: c.read_errors,
        write_errors: c.write_errors,
        cksum_errors: c.cksum_errors,
        read_ops: c.read_ops,
        write_ops: c.write_ops,
        read_bytes: c.read_bytes,
        write_bytes: c.write_bytes,
    }
}

/// A node of the vdev tree, with its children.
pub fn vdev_status(v: eng::VdevStatus) -> api::VdevStatus {
    api::VdevStatus {
        name: v.name,
        health: health(v.health),
        counters: counters(v.counters),
        note: v.note,
        children: v.children.into_iter().map(vdev_status).collect(),
    }
}

/// A scrub's or resilver's progress.
pub fn scan_status(s: eng::ScanStatus) -> api::ScanStatus {
    api::ScanStatus {
        kind: match s.kind {
            eng::ScanKind::Scrub => api::ScanKind::Scrub,
            eng::ScanKind::Resilver => api::ScanKind::Resilver,
        },
        state: match s.state {
            eng::ScanState::Scanning => api::ScanState::Scanning,
            eng::ScanState::Paused => api::ScanState::Paused,
            eng::ScanState::Finished => api::ScanState::Finished,
            eng::ScanState::Canceled => api::ScanState::Canceled,
        },
        started_unix: s.started_unix,
        ended_unix: s.ended_unix,
        examined_bytes: s.examined_bytes,
        total_bytes: s.total_bytes,
        repaired_bytes: s.repaired_bytes,
        errors: s.errors,
        rate_bytes_per_sec: s.rate_bytes_per_sec,
        eta_secs: s.eta_secs,
    }
}

/// What `status` says about one pool.
pub fn pool_status(p: eng::PoolStatus) -> api::PoolStatus {
    api::PoolStatus {
        name: p.name,
        guid: p.guid,
        health: health(p.health),
        message: p.message,
        action: p.action,
        txg: p.txg,
        scan: p.scan.map(scan_status),
        vdevs: p.vdevs.into_iter().map(vdev_status).collect(),
        logs: p.logs.into_iter().map(vdev_status).collect(),
        damaged: p.damaged,
        locked: Vec::new(),
        cache: None,
    }
}

/// The block cache's counters as the API shows them.
pub fn cache_counters(c: tarn_block::CacheStats) -> api::CacheCounters {
    api::CacheCounters {
        bytes: c.bytes,
        max_bytes: c.max_bytes,
        blocks: c.blocks,
        data_hits: c.data_hits,
        data_misses: c.data_misses,
        meta_hits: c.meta_hits,
        meta_misses: c.meta_misses,
        evicted: c.evicted,
        prefetched: c.prefetched,
        prefetch_hits: c.prefetch_hits,
    }
}

/// One row of `pool list`.
pub fn list_entry(e: eng::PoolListEntry) -> api::PoolListEntry {
    api::PoolListEntry {
        name: e.name,
        size: e.size,
        allocated: e.allocated,
        free: e.free,
        health: health(e.health),
        guid: e.guid,
    }
}

/// One row of `pool iostat`.
pub fn iostat_entry(e: eng::IostatEntry) -> api::IostatEntry {
    api::IostatEntry {
        name: e.name,
        depth: e.depth,
        allocated: e.allocated,
        free: e.free,
        counters: counters(e.counters),
    }
}

/// A pool `import` could import.
pub fn import_candidate(c: eng::ImportCandidate) -> api::ImportCandidate {
    api::ImportCandidate {
        name: c.name,
        guid: c.guid,
        health: health(c.health),
        devices: c.devices,
        note: c.note,
        active: c.active,
    }
}

/// A vdev layout, as the pool layer takes it.
pub fn vdev_kind(k: api::VdevKind) -> tarn_vdev::VdevKind {
    match k {
        api::VdevKind::Single => tarn_vdev::VdevKind::Single,
        api::VdevKind::Mirror => tarn_vdev::VdevKind::Mirror,
        api::VdevKind::Raidz1 => tarn_vdev::VdevKind::Raidz { parity: 1 },
        api::VdevKind::Raidz2 => tarn_vdev::VdevKind::Raidz { parity: 2 },
        api::VdevKind::Raidz3 => tarn_vdev::VdevKind::Raidz { parity: 3 },
    }
}

fn fault_kind_to_engine(k: api::FaultKind) -> tarn_vdev::FaultKind {
    match k {
        api::FaultKind::ReadError => tarn_vdev::FaultKind::ReadError,
        api::FaultKind::WriteError => tarn_vdev::FaultKind::WriteError,
        api::FaultKind::Bitflip => tarn_vdev::FaultKind::Bitflip,
        api::FaultKind::DropWrite => tarn_vdev::FaultKind::DropWrite,
        api::FaultKind::TornWrite => tarn_vdev::FaultKind::TornWrite,
        api::FaultKind::Latency => tarn_vdev::FaultKind::Latency,
        api::FaultKind::Vanish => tarn_vdev::FaultKind::Vanish,
        api::FaultKind::FlushError => tarn_vdev::FaultKind::FlushError,
    }
}

fn fault_kind(k: tarn_vdev::FaultKind) -> api::FaultKind {
    match k {
        tarn_vdev::FaultKind::ReadError => api::FaultKind::ReadError,
        tarn_vdev::FaultKind::WriteError => api::FaultKind::WriteError,
        tarn_vdev::FaultKind::Bitflip => api::FaultKind::Bitflip,
        tarn_vdev::FaultKind::DropWrite => api::FaultKind::DropWrite,
        tarn_vdev::FaultKind::TornWrite => api::FaultKind::TornWrite,
        tarn_vdev::FaultKind::Latency => api::FaultKind::Latency,
        tarn_vdev::FaultKind::Vanish => api::FaultKind::Vanish,
        tarn_vdev::FaultKind::FlushError => api::FaultKind::FlushError,
    }
}

/// A drill's fault, as the device layer takes it.
pub fn fault_to_engine(f: api::Fault) -> tarn_vdev::Fault {
    tarn_vdev::Fault {
        kind: fault_kind_to_engine(f.kind),
        probability: f.probability,
        range: f.range,
        latency_ms: f.latency_ms,
    }
}

/// A fault in force on a device.
pub fn fault(f: tarn_vdev::Fault) -> api::Fault {
    api::Fault {
        kind: fault_kind(f.kind),
        probability: f.probability,
        range: f.range,
        latency_ms: f.latency_ms,
    }
}

/// One row of `dataset list`.
pub fn dataset_info(d: tarn_dataset::DatasetInfo) -> api_ds::DatasetInfo {
    api_ds::DatasetInfo {
        name: d.name,
        kind: match d.kind {
            tarn_dataset::DatasetKind::Filesystem => api_ds::DatasetKind::Filesystem,
            tarn_dataset::DatasetKind::Snapshot => api_ds::DatasetKind::Snapshot,
            tarn_dataset::DatasetKind::Volume => api_ds::DatasetKind::Volume,
        },
        guid: d.guid,
        creation_unix: d.creation_unix,
        createtxg: d.createtxg,
        used: d.used,
        available: d.available,
        referenced: d.referenced,
        logicalused: d.logicalused,
        logicalreferenced: d.logicalreferenced,
        compressratio: d.compressratio,
        usedbydataset: d.usedbydataset,
        usedbysnapshots: d.usedbysnapshots,
        usedbychildren: d.usedbychildren,
        written: d.written,
        origin: d.origin,
        mountpoint: d.mountpoint,
        volsize: d.volsize,
        volblocksize: d.volblocksize,
        encryption: d.encryption,
        keystatus: d.keystatus,
        encryptionroot: d.encryptionroot,
    }
}

/// A property value with its source.
pub fn prop_value(p: tarn_dataset::PropValue) -> api_ds::PropValue {
    api_ds::PropValue {
        dataset: p.dataset,
        property: p.property,
        value: p.value,
        source: match p.source {
            tarn_dataset::Source::Local => api_ds::Source::Local,
            tarn_dataset::Source::Inherited(from) => api_ds::Source::Inherited(from),
            tarn_dataset::Source::Default => api_ds::Source::Default,
            tarn_dataset::Source::None => api_ds::Source::None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    fn same_json<E: Serialize, A: Serialize>(engine: &E, api: &A) {
        assert_eq!(
            serde_json::to_value(engine).unwrap(),
            serde_json::to_value(api).unwrap()
        );
    }

    fn engine_status() -> eng::PoolStatus {
        let leaf = |name: &str, health| eng::VdevStatus {
            name: name.into(),
            health,
            counters: eng::Counters {
                read_errors: 1,
                write_errors: 2,
                cksum_errors: 3,
                read_ops: 4,
                write_ops: 5,
                read_bytes: 6,
                write_bytes: 7,
            },
            note: Some("was /dev/sdc".into()),
            children: vec![],
        };
        eng::PoolStatus {
            name: "tank".into(),
            guid: "00c0ffee".into(),
            health: eng::Health::Degraded,
            message: Some("m".into()),
            action: None,
            txg: 9,
            scan: Some(eng::ScanStatus {
                kind: eng::ScanKind::Resilver,
                state: eng::ScanState::Paused,
                started_unix: 1,
                ended_unix: None,
                examined_bytes: 2,
                total_bytes: 3,
                repaired_bytes: 4,
                errors: 5,
                rate_bytes_per_sec: 6,
                eta_secs: Some(7),
            }),
            vdevs: vec![eng::VdevStatus {
                name: "mirror-0".into(),
                health: eng::Health::Degraded,
                counters: eng::Counters::default(),
                note: None,
                children: vec![
                    leaf("/dev/sdb", eng::Health::Online),
                    leaf("/dev/sdc", eng::Health::Offline),
                ],
            }],
            logs: vec![leaf("/dev/nvme0n1", eng::Health::Unavail)],
            damaged: vec!["object x".into()],
        }
    }

    #[test]
    fn pool_types_keep_their_wire_shape() {
        let status = engine_status();
        same_json(&status, &pool_status(status.clone()));
        let entry = eng::PoolListEntry {
            name: "tank".into(),
            size: 1,
            allocated: 2,
            free: 3,
            health: eng::Health::Faulted,
            guid: "ab".into(),
        };
        same_json(&entry, &list_entry(entry.clone()));
        let io = eng::IostatEntry {
            name: "tank".into(),
            depth: 1,
            allocated: 2,
            free: 3,
            counters: eng::Counters::default(),
        };
        same_json(&io, &iostat_entry(io.clone()));
        let candidate = eng::ImportCandidate {
            name: "tank".into(),
            guid: "ab".into(),
            health: eng::Health::Online,
            devices: vec!["/d/a".into()],
            note: None,
            active: true,
        };
        same_json(&candidate, &import_candidate(candidate.clone()));
        for kind in tarn_vdev::FaultKind::ALL {
            let f = tarn_vdev::Fault {
                kind,
                probability: 0.5,
                range: Some((1, 2)),
                latency_ms: 3,
            };
            same_json(&f, &fault(f.clone()));
            assert_eq!(fault_to_engine(fault(f.clone())), f);
            assert_eq!(fault_kind(kind).name(), kind.name());
        }
    }

    #[test]
    fn dataset_types_keep_their_wire_shape() {
        let info = tarn_dataset::DatasetInfo {
            name: "tank/a@s".into(),
            kind: tarn_dataset::DatasetKind::Snapshot,
            guid: 1,
            creation_unix: 2,
            createtxg: 9,
            used: 3,
            available: None,
            referenced: 4,
            logicalused: 5,
            logicalreferenced: 6,
            compressratio: 1.5,
            usedbydataset: 7,
            usedbysnapshots: 8,
            usedbychildren: 9,
            written: 10,
            origin: Some("tank/b@t".into()),
            mountpoint: None,
            volsize: None,
            volblocksize: None,
            encryption: None,
            keystatus: None,
            encryptionroot: None,
        };
        same_json(&info, &dataset_info(info.clone()));
        let enc = tarn_dataset::DatasetInfo {
            encryption: Some("aes-256-gcm".into()),
            keystatus: Some("unavailable".into()),
            encryptionroot: Some("tank/a".into()),
            ..info.clone()
        };
        same_json(&enc, &dataset_info(enc.clone()));
        let vol = tarn_dataset::DatasetInfo {
            kind: tarn_dataset::DatasetKind::Volume,
            volsize: Some(1 << 30),
            volblocksize: Some(16384),
            ..info.clone()
        };
        same_json(&vol, &dataset_info(vol.clone()));
        for source in [
            tarn_dataset::Source::Local,
            tarn_dataset::Source::Inherited("tank".into()),
            tarn_dataset::Source::Default,
            tarn_dataset::Source::None,
        ] {
            let p = tarn_dataset::PropValue {
                dataset: "tank/a".into(),
                property: "compression".into(),
                value: "lz4".into(),
                source,
            };
            let converted = prop_value(p.clone());
            same_json(&p, &converted);
            assert_eq!(p.source.to_string(), converted.source.to_string());
        }
    }
}
