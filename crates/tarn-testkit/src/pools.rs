//! Pools on member files: options for tests, create and import, scans
//! waited for, error counters summed, where a block's bytes lie.

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
    props: &[(&str, &str)],
    opts: PoolOptions,
) -> Result<Arc<Pool>, PoolError> {
    let props: BTreeMap<String, String> = props
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Pool::create(
        name,
        &[VdevSpec {
            kind,
            devices: devs.to_vec(),
        }],
        12,
        &props,
        false,
        opts,
    )
}

/// Imports pool `name` from the files in `dir`, using [`opts`], with the
/// dataset layer attached (as the daemon does).
pub fn import(dir: &Path, name: &str) -> Arc<Pool> {
    attached(
        Pool::import(&[dir.to_path_buf()], &[], name, None, false, opts())
            .unwrap_or_else(|e| panic!("import {name}: {e}")),
    )
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
