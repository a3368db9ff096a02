//! `tarn bench`: the table owners make by hand with fio, built in.
//!
//! On a scratch dataset of the pool (one per combination of `--sweep`
//! settings, destroyed afterwards), mounted through FUSE, it measures what
//! decides whether a setting is worth it: 4 KiB random reads with 32 in
//! flight (a VM's disk, a database), 4 KiB random reads one at a time (a
//! latency-bound client), 4 KiB random writes with 32 in flight then an
//! fsync, sequential reads and writes of 1 MiB requests with 4 readers or
//! one writer, and "cat speed": one reader in 1 MiB requests, as
//! `cat file > /dev/null` or a media player reads. With `--dir` it runs the same
//! workloads in any directory (another tarn mount, an NFS or WebDAV mount
//! of a client machine, a plain disk for comparison); with `--client
//! nfs://…` over the network with tarn's own NFS client ([`nfs`]).
//! Both run the same row of workloads ([`row`]) on a [`TestFile`].
//!
//! Requests are `pread`/`pwrite` from threads (one per request in
//! flight) on a file opened with O_DIRECT, as fio's `psync` engine with
//! `--direct=1` issues them, so they reach the filesystem instead of the
//! kernel's page cache and the figures compare with fio's on the same
//! file. tarn's own block cache still serves what it holds: a test file
//! smaller than `--cache-mib` is read from memory after the first pass,
//! which is what a working set that fits gets.
//! Nothing here is a test: figures vary from run to run.

pub mod nfs;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::{Deserialize, Serialize};
use tarn_api::method;
use tarn_api::params::{DatasetCreateParams, DatasetDestroyParams, MountParams, UnmountParams};

use crate::render::table;
use crate::session::{Out, Session};

/// `tarn bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The pool to measure (a scratch dataset is made in it), unless
    /// --dir is given
    pub pool: Option<String>,
    /// Measure in this directory instead of a scratch dataset
    #[arg(long, value_name = "DIR", conflicts_with = "pool")]
    pub dir: Option<PathBuf>,
    /// Measure a share from this machine over the network:
    /// nfs://HOST[:PORT]/SHARE[/DIR] (no daemon or mount needed here)
    #[arg(long, value_name = "URL", conflicts_with_all = ["pool", "dir"])]
    pub client: Option<String>,
    /// Size of the test file
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Seconds each random workload runs
    #[arg(long, default_value_t = 10)]
    pub runtime: u64,
    /// Settings to compare, one row per combination:
    /// `--sweep recordsize=128K,1M --sweep compression=off,lz4
    /// --sweep encryption=off,aes-256-gcm` (any dataset property)
    #[arg(long, value_name = "PROP=V1,V2,...")]
    pub sweep: Vec<String>,
}

/// One row of the table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// The settings of this row (property → value).
    pub settings: Vec<(String, String)>,
    /// 4 KiB random reads, 32 in flight, per second.
    pub randread_iops_qd32: f64,
    /// 4 KiB random reads, one at a time, per second.
    pub read_iops_qd1: f64,
    /// 4 KiB random writes, 32 in flight, per second (with the final
    /// fsync).
    pub write_iops_qd32: f64,
    /// Sequential reads, 1 MiB, 4 readers, MB/s (10^6 bytes).
    pub read_mb_s: f64,
    /// Sequential write, 1 MiB, one writer, then fsync, MB/s.
    pub write_mb_s: f64,
    /// One reader, 1 MiB reads, MB/s.
    pub cat_mb_s: f64,
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: u64 = t[..split]
        .parse()
        .with_context(|| format!("'{s}' is not a size"))?;
    let shift = match t[split..].to_ascii_uppercase().as_str() {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        other => bail!("'{s}': unknown unit '{other}' (K, M, G)"),
    };
    let bytes = n << shift;
    if bytes < (16 << 20) {
        bail!("--size {s}: at least 16M");
    }
    Ok(bytes)
}

/// The combinations of the sweep options, in order.
pub fn combinations(sweep: &[String]) -> anyhow::Result<Vec<Vec<(String, String)>>> {
    let mut out: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for s in sweep {
        let (prop, values) = s
            .split_once('=')
            .with_context(|| format!("--sweep {s}: use PROP=V1,V2"))?;
        let values: Vec<&str> = values.split(',').filter(|v| !v.is_empty()).collect();
        if prop.is_empty() || values.is_empty() {
            bail!("--sweep {s}: use PROP=V1,V2");
        }
        out = out
            .into_iter()
            .flat_map(|row| {
                values.iter().map(move |v| {
                    let mut r = row.clone();
                    r.push((prop.to_string(), v.to_string()));
                    r
                })
            })
            .collect();
    }
    Ok(out)
}

fn progress(what: &str) {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K{what}");
        let _ = std::io::stderr().flush();
    }
}

fn drop_caches() {
    let _ = std::process::Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Opens `file` for direct I/O (around the page cache, so reads reach
/// the filesystem as fio's `--direct=1` does); buffered where the
/// filesystem refuses O_DIRECT (tmpfs), with the caches dropped.
fn open_direct(file: &Path, write: bool) -> anyhow::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let direct = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(file);
    match direct {
        Ok(f) => Ok(f),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            drop_caches();
            OpenOptions::new()
                .read(true)
                .write(write)
                .open(file)
                .with_context(|| format!("open {}", file.display()))
        }
        Err(e) => Err(e).with_context(|| format!("open {}", file.display())),
    }
}

/// A buffer of `len` bytes at a 4096-byte aligned address (what O_DIRECT
/// asks of user memory): a larger vector and the aligned window in it.
struct Aligned {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize, fill: u8) -> Aligned {
        let buf = vec![fill; len + 4096];
        let start = buf.as_ptr().align_offset(4096).min(4096);
        Aligned { buf, start, len }
    }
    fn get(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// A small fast generator for offsets (not for secrets).
/// The sum of what the threads of a sequential pass read.
pub(crate) fn join_sum<E>(
    handles: Vec<std::thread::JoinHandle<Result<u64, E>>>,
) -> anyhow::Result<u64>
where
    anyhow::Error: From<E>,
{
    let mut total = 0;
    for h in handles {
        total += h
            .join()
            .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))??;
    }
    Ok(total)
}

/// xorshift64: the benchmarks' cheap random numbers.
pub(crate) fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Runs `threads` workers doing 4 KiB requests at random offsets of
/// `file` for `runtime`; requests per second.
fn random_io(
    file: &Path,
    size: u64,
    threads: usize,
    runtime: Duration,
    write: bool,
) -> anyhow::Result<f64> {
    let f = Arc::new(open_direct(file, write)?);
    let blocks = size / 4096;
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + runtime;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let f = f.clone();
            let count = count.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut aligned = Aligned::new(4096, 0x5a);
                let buf = aligned.get();
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ ((i as u64 + 1) << 32);
                while Instant::now() < deadline {
                    for _ in 0..16 {
                        let off = (next(&mut state) % blocks) * 4096;
                        if write {
                            f.write_all_at(buf, off)?;
                        } else {
                            f.read_exact_at(buf, off)?;
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))??;
    }
    if write {
        f.sync_all()?;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

/// Reads `file` with `readers` threads, each a contiguous share, in 1 MiB
/// requests; MB/s.
fn sequential_read(file: &Path, size: u64, readers: u64) -> anyhow::Result<f64> {
    let f = Arc::new(open_direct(file, false)?);
    let share = size / readers;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..readers)
        .map(|i| {
            let f = f.clone();
            std::thread::spawn(move || -> std::io::Result<u64> {
                let mut aligned = Aligned::new(1 << 20, 0);
                let buf = aligned.get();
                let (mut off, end) = (i * share, (i + 1) * share);
                let mut total = 0;
                while off < end {
                    let n = f.read_at(buf, off)?;
                    if n == 0 {
                        break;
                    }
                    off += n as u64;
                    total += n as u64;
                }
                Ok(total)
            })
        })
        .collect();
    let total = join_sum(handles)?;
    Ok(total as f64 / 1e6 / t0.elapsed().as_secs_f64())
}

/// Writes `size` bytes of incompressible data in 1 MiB requests, then
/// fsync; MB/s.
fn sequential_write(file: &Path, size: u64) -> anyhow::Result<f64> {
    let mut f = File::create(file).with_context(|| format!("create {}", file.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut state = 0x1234_5678_9abc_def1u64;
    let t0 = Instant::now();
    let mut written = 0;
    while written < size {
        for chunk in buf.chunks_mut(8) {
            chunk.copy_from_slice(&next(&mut state).to_le_bytes()[..chunk.len()]);
        }
        f.write_all(&buf)?;
        written += buf.len() as u64;
    }
    f.sync_all()?;
    Ok(written as f64 / 1e6 / t0.elapsed().as_secs_f64())
}

/// Where a row's workloads run: a file in a directory (local, or any
/// mount) or a file of an NFS share ([`nfs`]). Each returns its figure.
pub(crate) trait TestFile {
    /// Writes the file in 1 MiB requests, then makes it durable: MB/s.
    fn write(&self, size: u64) -> anyhow::Result<f64>;
    /// Reads it with `streams` readers, each a contiguous share: MB/s.
    fn read(&self, size: u64, streams: u64) -> anyhow::Result<f64>;
    /// 4 KiB requests at random offsets, `depth` in flight, for
    /// `runtime` (writes end durable): requests per second.
    fn random(
        &self,
        size: u64,
        depth: usize,
        runtime: Duration,
        write: bool,
    ) -> anyhow::Result<f64>;
    /// Before a read pass: forget what this machine caches of the file.
    fn settle(&self) {}
}

/// The six workloads of a row, in the table's order, on `f`.
pub(crate) fn row(
    f: &dyn TestFile,
    size: u64,
    runtime: Duration,
    progress: &dyn Fn(&str),
) -> anyhow::Result<BenchRow> {
    progress("sequential write");
    let write_mb_s = f.write(size)?;
    f.settle();
    progress("cat");
    let cat_mb_s = f.read(size, 1)?;
    f.settle();
    progress("sequential read");
    let read_mb_s = f.read(size, 4)?;
    f.settle();
    progress("random read, 32 in flight");
    let randread_iops_qd32 = f.random(size, 32, runtime, false)?;
    f.settle();
    progress("random read, one at a time");
    let read_iops_qd1 = f.random(size, 1, runtime, false)?;
    progress("random write, 32 in flight");
    let write_iops_qd32 = f.random(size, 32, runtime, true)?;
    Ok(BenchRow {
        settings: Vec::new(),
        randread_iops_qd32,
        read_iops_qd1,
        write_iops_qd32,
        read_mb_s,
        write_mb_s,
        cat_mb_s,
    })
}

/// A test file of this machine: O_DIRECT requests from threads, the page
/// cache dropped between passes.
struct LocalFile(PathBuf);

impl TestFile for LocalFile {
    fn write(&self, size: u64) -> anyhow::Result<f64> {
        sequential_write(&self.0, size)
    }

    fn read(&self, size: u64, streams: u64) -> anyhow::Result<f64> {
        sequential_read(&self.0, size, streams)
    }

    fn random(
        &self,
        size: u64,
        depth: usize,
        runtime: Duration,
        write: bool,
    ) -> anyhow::Result<f64> {
        random_io(&self.0, size, depth, runtime, write)
    }

    fn settle(&self) {
        drop_caches();
    }
}

/// Every workload in `dir` on a file of `size` bytes.
pub fn run_in(dir: &Path, size: u64, runtime: Duration, label: &str) -> anyhow::Result<BenchRow> {
    let file = LocalFile(dir.join(format!("tarn-bench-{}.dat", std::process::id())));
    let result = row(&file, size, runtime, &|what| {
        progress(&format!("{label}: {what}"))
    });
    let _ = std::fs::remove_file(&file.0);
    progress("");
    result
}

fn render(rows: &[BenchRow]) -> String {
    let mut header: Vec<String> = rows
        .first()
        .map(|r| r.settings.iter().map(|(k, _)| k.to_uppercase()).collect())
        .unwrap_or_default();
    for h in [
        "RANDREAD IOPS (4K QD32)",
        "READ IOPS (4K QD1)",
        "WRITE IOPS (4K QD32)",
        "READ MB/S",
        "WRITE MB/S",
        "CAT MB/S",
    ] {
        header.push(h.to_string());
    }
    let left: Vec<usize> = (0..rows.first().map(|r| r.settings.len()).unwrap_or(0)).collect();
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row: Vec<String> = r.settings.iter().map(|(_, v)| v.clone()).collect();
            row.extend([
                format!("{:.0}", r.randread_iops_qd32),
                format!("{:.0}", r.read_iops_qd1),
                format!("{:.0}", r.write_iops_qd32),
                format!("{:.0}", r.read_mb_s),
                format!("{:.0}", r.write_mb_s),
                format!("{:.0}", r.cat_mb_s),
            ]);
            row
        })
        .collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    table(&h, &body, &left)
}

pub(crate) fn bench_command(
    client: &mut Session,
    out: &Out,
    args: BenchArgs,
) -> anyhow::Result<()> {
    let size = parse_size(&args.size)?;
    let runtime = Duration::from_secs(args.runtime.max(1));
    let mut rows = Vec::new();
    if let Some(url) = &args.client {
        if !args.sweep.is_empty() {
            bail!("--sweep makes scratch datasets: give a pool, not --client");
        }
        let row = nfs::run(url, size, runtime, &|w| progress(&format!("{url}: {w}")));
        progress("");
        rows.push(row?);
    } else if let Some(dir) = &args.dir {
        if !args.sweep.is_empty() {
            bail!("--sweep makes scratch datasets: give a pool, not --dir");
        }
        rows.push(run_in(dir, size, runtime, &dir.display().to_string())?);
    } else {
        let Some(pool) = &args.pool else {
            bail!("give the pool to measure (or --dir DIR)");
        };
        let combos = combinations(&args.sweep)?;
        let total = combos.len();
        for (i, settings) in combos.into_iter().enumerate() {
            let label = format!(
                "[{}/{total}] {}",
                i + 1,
                settings
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let mut row = on_scratch(client, pool, &settings, size, runtime, &label)?;
            row.settings = settings;
            rows.push(row);
        }
    }
    let v = serde_json::to_value(&rows)?;
    out.raw_or(&v, || render(&rows))
}

/// Makes a scratch dataset with `settings`, mounts it, runs the workloads
/// in it, and destroys it (also when a workload fails).
fn on_scratch(
    client: &mut Session,
    pool: &str,
    settings: &[(String, String)],
    size: u64,
    runtime: Duration,
    label: &str,
) -> anyhow::Result<BenchRow> {
    let name = format!("{pool}/tarn-bench-{}", std::process::id());
    let mut properties: std::collections::BTreeMap<String, String> =
        settings.iter().cloned().collect();
    let mut key = None;
    if properties.get("encryption").is_some_and(|e| e != "off") {
        properties
            .entry("keyformat".into())
            .or_insert_with(|| "passphrase".into());
        let pass = format!("tarn bench scratch key {}", std::process::id());
        key = Some(pass.bytes().map(|b| format!("{b:02x}")).collect::<String>());
    }
    let mnt = tempfile_dir()?;
    client.call(
        method::DATASET_CREATE,
        &DatasetCreateParams {
            name: name.clone(),
            properties,
            parents: false,
            key,
        },
    )?;
    let result = (|| -> anyhow::Result<BenchRow> {
        client.call(
            method::DATASET_MOUNT,
            &MountParams {
                name: name.clone(),
                mountpoint: Some(mnt.display().to_string()),
                allow_other: false,
                read_only: false,
            },
        )?;
        let r = run_in(&mnt, size, runtime, label);
        let _ = client.call(
            method::DATASET_UNMOUNT,
            &UnmountParams { name: name.clone() },
        );
        r
    })();
    let _ = client.call(
        method::DATASET_DESTROY,
        &DatasetDestroyParams {
            name,
            recursive: true,
        },
    );
    let _ = std::fs::remove_dir(&mnt);
    result
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for i in 0..100 {
        let p = base.join(format!("tarn-bench-{}-{i}", std::process::id()));
        if std::fs::create_dir(&p).is_ok() {
            return Ok(p);
        }
    }
    bail!("cannot make a mountpoint in {}", base.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_multiply_out() {
        let c = combinations(&["recordsize=128K,1M".into(), "compression=off,lz4".into()]).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(
            c[1],
            [
                ("recordsize".to_string(), "128K".to_string()),
                ("compression".to_string(), "lz4".to_string())
            ]
        );
        assert_eq!(
            combinations(&[]).unwrap(),
            vec![Vec::<(String, String)>::new()]
        );
        assert!(combinations(&["recordsize".into()]).is_err());
        assert!(combinations(&["recordsize=".into()]).is_err());
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("1K").is_err(), "too small to mean anything");
        assert!(parse_size("12X").is_err());
    }
}
