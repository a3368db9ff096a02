//! Pools on member files: options for tests, create and import (`tank`
//! on fresh files in one call), scans waited for, error counters summed,
//! where a block's bytes lie.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tarn_block::BlockPtr;
use tarn_pool::status::{ScanState, ScanStatus, VdevStatus};
use tarn_pool::{Pool, PoolError, PoolOptions, ScanAction, VdevSpec};
use tarn_vdev::{VdevKind, DATA_START};

/// Options for tests: txgs commit only when a test asks (or the dirty
/// limit is reached), so what is on disk is what the test decided.
pub fn opts() -> PoolOptions {
    PoolOptions {
        sync_interval: Duration::from_secs(3600),
        owner: "test".into(),
        ..Default::default()
    }
}

/// Properties from `(name, value)` pairs.
pub fn props(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Pool `tank` on `n` fresh member files `d0..` of `size` bytes in `dir`
/// (one top-level vdev of `kind`, ashift 12, [`opts`]), with the dataset
/// layer attached.
pub fn tank(dir: &Path, kind: VdevKind, n: usize, size: u64) -> Arc<Pool> {
    tank_with(dir, kind, n, size, opts())
}

/// Like [`tank`], with other options.
pub fn tank_with(dir: &Path, kind: VdevKind, n: usize, size: u64, opts: PoolOptions) -> Arc<Pool> {
    let devs = crate::files::make(dir, "d", n, size);
    attached(create_with("tank", kind, &devs, &[], opts).expect("create pool tank"))
}

/// Creates pool `name` of one top-level vdev over `devs` (ashift 12) with
/// `props`, using [`opts`].
pub fn create(
    name: &str,
    kind: VdevKind,
    devs: &[PathBuf],
    props: &[(&str, &str)],
) -> Result<Arc<Pool>, PoolError> {
    create_with(name, kind, devs, props, opts())
}

/// Like [`create`], with other options.
pub fn create_with(
    name: &str,
    kind: VdevKind,
    devs: &[PathBuf],
    props_kv: &[(&str, &str)],
    opts: PoolOptions,
) -> Result<Arc<Pool>, PoolError> {
    let spec = VdevSpec {
        kind,
        devices: devs.to_vec(),
    };
    Pool::create(name, &[spec], 12, &props(props_kv), false, opts)
}

/// One top-level vdev of a single device for each of `devs` (a stripe).
pub fn singles(devs: &[PathBuf]) -> Vec<VdevSpec> {
    devs.iter()
        .map(|d| VdevSpec {
            kind: VdevKind::Single,
            devices: vec![d.clone()],
        })
        .collect()
}

/// Imports pool `name` from the files in `dir`, using [`opts`], with the
/// dataset layer attached (as the daemon does).
pub fn import(dir: &Path, name: &str) -> Arc<Pool> {
    attached(
        try_import(&[dir], name, false, opts()).unwrap_or_else(|e| panic!("import {name}: {e}")),
    )
}

/// Imports pool `name` from the files in `dirs` with `opts` (`force`: take
/// it over from an owner that never exported it), without attaching the
/// dataset layer, and says why not when it cannot.
pub fn try_import(
    dirs: &[&Path],
    name: &str,
    force: bool,
    opts: PoolOptions,
) -> Result<Arc<Pool>, PoolError> {
    let dirs: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    Pool::import(&dirs, &[], name, None, force, opts)
}

/// Attaches the dataset layer to a pool just imported: until it is, scans
/// started by the import wait for it, and its intent log is not replayed.
pub fn attached(pool: Arc<Pool>) -> Arc<Pool> {
    tarn_dataset::attach(&pool).unwrap_or_else(|e| panic!("attach {}: {e}", pool.name()));
    pool
}

/// Waits (up to two minutes) for the current scan to finish or be canceled.
pub fn wait_scan(pool: &Pool) -> ScanStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = pool.status().scan {
            if s.state == ScanState::Finished || s.state == ScanState::Canceled {
                return s;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "scan did not finish"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a scrub to its end.
pub fn scrub(pool: &Arc<Pool>) -> ScanStatus {
    pool.scrub(ScanAction::Start).expect("start a scrub");
    wait_scan(pool)
}

/// Checksum errors counted over every leaf.
pub fn cksum_errors(pool: &Pool) -> u64 {
    fn sum(v: &[VdevStatus]) -> u64 {
        v.iter()
            .map(|x| {
                if x.children.is_empty() {
                    x.counters.cksum_errors
                } else {
                    sum(&x.children)
                }
            })
            .sum()
    }
    sum(&pool.status().vdevs)
}

/// How many members of a vdev may fail.
pub fn redundancy(kind: VdevKind, n: usize) -> usize {
    match kind {
        VdevKind::Raidz { parity } => parity as usize,
        VdevKind::Mirror => n - 1,
        VdevKind::Single => 0,
    }
}

/// The byte ranges of the members of a one-vdev pool (ashift 12, `n`
/// members) that hold the first copy of `bp`: (member, offset, length).
pub fn block_ranges(kind: VdevKind, n: usize, bp: &BlockPtr) -> Vec<(usize, u64, u64)> {
    let d = bp.dvas[0];
    match kind {
        VdevKind::Raidz { .. } => {
            let s = 4096u64;
            let b = d.offset / s;
            let tot = d.asize as u64 / s;
            let mut per: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
            for l in b..b + tot {
                let child = (l % n as u64) as usize;
                let off = DATA_START + (l / n as u64) * s;
                let e = per.entry(child).or_insert((off, off));
                e.0 = e.0.min(off);
                e.1 = e.1.max(off + s);
            }
            per.into_iter().map(|(c, (a, z))| (c, a, z - a)).collect()
        }
        _ => (0..n)
            .map(|c| (c, DATA_START + d.offset, d.asize as u64))
            .collect(),
    }
}

/// Waits (up to 30 s) until `cache` holds at least `n` blocks read ahead,
/// and returns its counters then; fails the test if they never come.
pub fn wait_prefetched(cache: &tarn_block::BlockCache, n: u64) -> tarn_block::CacheStats {
    let t0 = std::time::Instant::now();
    loop {
        let s = cache.stats();
        if s.prefetched >= n {
            return s;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "read-ahead never came: {s:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
