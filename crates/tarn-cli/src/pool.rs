//! `tarn pool ...`: create, import, inspect and repair pools. Besides the
//! commands, what turns the command line into requests (devices made
//! absolute, `-o`/`-O` properties, `iostat` arguments; the vdev words
//! themselves are read by `tarn_api::pool::parse_vdev_words`, which every
//! client shares) and the loops that poll the daemon (`scrub --wait`,
//! `iostat INTERVAL`).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use clap::Subcommand;
use tarn_api::method;
use tarn_api::params::{
    AddLogParams, ClearParams, DeviceParams, ForceParams, InjectParams, NameParams, NoParams,
    OptionalNameParams, ReplaceParams, ScrubParams, SyncResult,
};
use tarn_api::pool::{
    parse_log_words, parse_vdev_words, CacheCounters, CreateRequest, Fault, FaultKind,
    ImportRequest, ImportResult, IostatEntry, PoolListEntry, PoolStatus, ScanKind, ScanState,
    ScanStatus, ScrubAction, VdevSpec,
};

use crate::render;
use crate::session::{absolute, decode, device_arg, Out, Session};

/// `tarn pool ...`.
#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Create a pool: `tarn pool create tank mirror /dev/sdb /dev/sdc`
    Create {
        /// Property of the pool's data, e.g. -O compression=lz4 -O checksum=xxh3
        #[arg(short = 'O', value_name = "PROP=VALUE")]
        properties: Vec<String>,
        /// Use devices even if they seem to belong to another pool
        #[arg(short, long)]
        force: bool,
        /// Name of the new pool
        name: String,
        /// Devices, grouped by `mirror`, `raidz1` (or `raidz`), `raidz2`,
        /// `raidz3`; plain devices before any group are single vdevs
        #[arg(required = true, value_name = "VDEV")]
        vdevs: Vec<String>,
    },
    /// Import a pool, or list the pools that can be imported
    Import {
        /// Directory (or device) to search; repeatable
        #[arg(short = 'd', long = "dir", value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Import even if the pool may be in use elsewhere
        #[arg(short, long)]
        force: bool,
        /// Import even though the intent log cannot be read or replayed
        /// in full (a missing log device, device errors), keeping what
        /// precedes the damage
        #[arg(long)]
        discard_log: bool,
        /// Pool to import, by name or id; omit to list candidates
        pool: Option<String>,
        /// Import under this name instead
        new_name: Option<String>,
    },
    /// Commit and release a pool so it can be moved
    Export {
        /// Export even if the pool is busy
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
    },
    /// Destroy a pool and everything in it
    Destroy {
        /// Destroy even if the pool is busy
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
    },
    /// List pools with size, use and health
    List,
    /// Health, scan progress, device tree and errors of pools
    Status {
        /// Show only pools that need attention
        #[arg(short = 'x')]
        unhealthy: bool,
        /// Pool name; all pools when omitted
        pool: Option<String>,
    },
    /// Start, pause, resume or cancel a scrub
    Scrub {
        /// Pause the running scrub
        #[arg(short = 'p', group = "scrub_action")]
        pause: bool,
        /// Stop (cancel) the running scrub
        #[arg(short = 's', group = "scrub_action")]
        stop: bool,
        /// Resume a paused scrub
        #[arg(long, group = "scrub_action")]
        resume: bool,
        /// Wait for the scrub to end, showing progress; fail if it found
        /// errors it could not repair
        #[arg(long, conflicts_with_all = ["pause", "stop"])]
        wait: bool,
        /// Pool name
        pool: String,
    },
    /// Take a device out of service
    Offline {
        /// Pool name
        pool: String,
        /// Device
        device: String,
    },
    /// Bring a device back into service
    Online {
        /// Pool name
        pool: String,
        /// Device
        device: String,
    },
    /// Add a separate intent log device: `tarn pool add tank log [mirror] DEV...`
    Add {
        /// Use devices even if they seem to belong to another pool
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
        /// `log`, then one device or `mirror` and devices
        #[arg(required = true, num_args = 2..)]
        vdev: Vec<String>,
    },
    /// Remove a log device
    Remove {
        /// Pool name
        pool: String,
        /// The log device
        device: String,
    },
    /// Replace a device by another and resilver onto it
    Replace {
        /// Use the new device even if it seems to belong to another pool
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
        /// Device leaving the pool
        old: String,
        /// Device taking its place
        new: String,
    },
    /// Reset error counters of a pool or one device
    Clear {
        /// Pool name
        pool: String,
        /// Device; all devices when omitted
        device: Option<String>,
    },
    /// I/O statistics: `iostat [-v] [POOL] [INTERVAL [COUNT]]`
    Iostat {
        /// Also show the block cache: size, hits and misses, read-ahead
        #[arg(short, long)]
        verbose: bool,
        /// Optional pool, then seconds between reports and how many; the
        /// first report shows totals since import, later ones per-second
        /// rates over each interval
        #[arg(num_args = 0..=3, value_names = ["POOL", "INTERVAL", "COUNT"])]
        args: Vec<String>,
    },
    /// Throughput, IOPS and latency per pool and protocol over the last
    /// hour (a point per 10 s) or day (`--day`, a point per 5 min)
    History {
        /// The last day instead of the last hour
        #[arg(long)]
        day: bool,
        /// Only the last N points
        #[arg(long, value_name = "N")]
        last: Option<usize>,
    },
    /// Commit the pool's open transaction group now
    Sync {
        /// Pool name
        pool: String,
    },
    /// Drills: make a device misbehave (read-error, write-error, bitflip,
    /// drop-write, torn-write, latency, vanish, flush-error), or `--clear` it
    Inject {
        /// Pool name
        pool: String,
        /// Member device
        device: String,
        /// Fault kind; omit with --clear
        kind: Option<String>,
        /// Share of the I/Os it hits, 0..1
        #[arg(long, default_value_t = 1.0)]
        probability: f64,
        /// Delay of a latency fault
        #[arg(long, default_value_t = 100)]
        latency_ms: u64,
        /// Remove every fault of the device
        #[arg(long)]
        clear: bool,
    },
}

/// Makes a vdev's devices absolute, relative to the working directory of
/// the command (the daemon has its own).
fn absolute_devices(vdev: &mut VdevSpec) -> anyhow::Result<()> {
    for dev in &mut vdev.devices {
        *dev = absolute(Path::new(dev.as_str()))?;
    }
    Ok(())
}

fn build_create(
    name: String,
    words: &[String],
    pool_props: Vec<(String, String)>,
    data_props: &[String],
    force: bool,
) -> anyhow::Result<CreateRequest> {
    let mut vdevs = parse_vdev_words(words)?;
    for vdev in &mut vdevs {
        absolute_devices(vdev)?;
    }
    let mut ashift = None;
    for (key, value) in pool_props {
        match key.as_str() {
            "ashift" => {
                ashift = Some(value.parse::<u8>().map_err(|_| {
                    anyhow!("-o ashift={value}: expected a number such as 12 (4 KiB sectors)")
                })?)
            }
            _ => bail!(
                "-o {key}={value}: unknown pool property; the pool property at creation is \
                 ashift; data properties such as compression go with -O"
            ),
        }
    }
    let mut properties = BTreeMap::new();
    for prop in data_props {
        let (key, value) = prop
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| anyhow!("-O {prop}: expected PROP=VALUE, e.g. -O compression=lz4"))?;
        if properties
            .insert(key.to_string(), value.to_string())
            .is_some()
        {
            bail!("-O {key} is given twice; keep one");
        }
    }
    let req = CreateRequest {
        name,
        vdevs,
        ashift,
        properties,
        force,
    };
    req.validate()?;
    Ok(req)
}

/// Splits `iostat` arguments into pool, interval and count: trailing numbers
/// are the interval and count, like `zpool iostat`.
fn parse_iostat_args(
    args: &[String],
) -> anyhow::Result<(Option<String>, Option<f64>, Option<u64>)> {
    let is_number = |s: &String| s.parse::<f64>().is_ok();
    let numbers = args
        .iter()
        .rev()
        .take_while(|a| is_number(a))
        .count()
        .min(2);
    let (names, numbers) = args.split_at(args.len() - numbers);
    if names.len() > 1 {
        bail!(
            "iostat takes one pool at most, got {}; usage: tarn pool iostat [POOL] [INTERVAL [COUNT]]",
            names.join(" ")
        );
    }
    let interval = match numbers.first() {
        Some(s) => {
            let secs: f64 = s.parse()?;
            if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
                bail!("iostat interval {s}: give seconds between 0 and 86400");
            }
            Some(secs)
        }
        None => None,
    };
    let count = match numbers.get(1) {
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| anyhow!("iostat count {s}: give a whole number of reports"))?,
        ),
        None => None,
    };
    Ok((names.first().cloned(), interval, count))
}

pub(crate) fn pool_command(
    client: &mut Session,
    out: &Out,
    cmd: PoolCommand,
    pool_props: Vec<(String, String)>,
) -> anyhow::Result<()> {
    match cmd {
        PoolCommand::Create {
            properties,
            force,
            name,
            vdevs,
        } => {
            let req = build_create(name, &vdevs, pool_props, &properties, force)?;
            client.call_quietly(out, method::POOL_CREATE, &req)?;
        }
        PoolCommand::Import {
            dirs,
            force,
            discard_log,
            pool,
            new_name,
        } => {
            let mut req = ImportRequest {
                pool,
                new_name,
                force,
                discard_log,
                ..ImportRequest::default()
            };
            for dir in &dirs {
                let abs = absolute(dir)?;
                if dir.is_dir() {
                    req.dirs.push(abs);
                } else {
                    req.devices.push(abs);
                }
            }
            req.validate()?;
            let v = client.call(method::POOL_IMPORT, &req)?;
            let result: ImportResult = decode(method::POOL_IMPORT, v.clone())?;
            out.raw_or(&v, || match result {
                ImportResult::Candidates(c) => render::render_candidates(&c),
                ImportResult::Imported(_) => String::new(),
            })?;
        }
        PoolCommand::Export { force, pool } => {
            client.call_quietly(out, method::POOL_EXPORT, &ForceParams { name: pool, force })?;
        }
        PoolCommand::Destroy { force, pool } => {
            client.call_quietly(
                out,
                method::POOL_DESTROY,
                &ForceParams { name: pool, force },
            )?;
        }
        PoolCommand::List => {
            let v = client.call(method::POOL_LIST, &NoParams {})?;
            let pools: Vec<PoolListEntry> = decode(method::POOL_LIST, v.clone())?;
            out.raw_or(&v, || render::render_list(&pools))?;
        }
        PoolCommand::Status { unhealthy, pool } => {
            let v = client.call(method::POOL_STATUS, &OptionalNameParams { name: pool })?;
            let mut pools: Vec<PoolStatus> = decode(method::POOL_STATUS, v.clone())?;
            if unhealthy {
                pools.retain(PoolStatus::needs_attention);
                let v = serde_json::to_value(&pools)?;
                out.raw_or(&v, || {
                    if pools.is_empty() {
                        "all pools are healthy\n".to_string()
                    } else {
                        render::render_status(&pools)
                    }
                })?;
            } else {
                out.raw_or(&v, || render::render_status(&pools))?;
            }
        }
        PoolCommand::Scrub {
            pause,
            stop,
            resume,
            wait,
            pool,
        } => {
            let action = match (pause, stop, resume) {
                (true, _, _) => ScrubAction::Pause,
                (_, true, _) => ScrubAction::Cancel,
                (_, _, true) => ScrubAction::Resume,
                _ => ScrubAction::Start,
            };
            let params = ScrubParams {
                name: pool.clone(),
                action,
            };
            let v = client.call(method::POOL_SCRUB, &params)?;
            if !wait {
                return out.raw_or(&v, String::new);
            }
            let started: Option<ScanStatus> = decode(method::POOL_SCRUB, v)?;
            let scan = wait_for_scrub(client, &pool, started.map_or(0, |s| s.started_unix))?;
            let v = serde_json::to_value(&scan)?;
            out.raw_or(&v, || format!("{}\n", render::scan_text(&scan)))?;
            match scan.state {
                ScanState::Canceled => bail!("the scrub of {pool} was canceled before it finished"),
                _ if scan.errors > 0 => bail!(
                    "the scrub of {pool} found {} error{} it could not repair\n\
                     hint: `tarn pool status {pool}` lists the damaged objects",
                    scan.errors,
                    if scan.errors == 1 { "" } else { "s" }
                ),
                _ => {}
            }
        }
        PoolCommand::Offline { pool, device } => {
            let params = DeviceParams {
                name: pool,
                device: device_arg(&device)?,
            };
            client.call_quietly(out, method::POOL_OFFLINE, &params)?;
        }
        PoolCommand::Online { pool, device } => {
            let params = DeviceParams {
                name: pool,
                device: device_arg(&device)?,
            };
            client.call_quietly(out, method::POOL_ONLINE, &params)?;
        }
        PoolCommand::Add { force, pool, vdev } => {
            let mut vdev = parse_log_words(&vdev)?;
            absolute_devices(&mut vdev)?;
            let params = AddLogParams {
                name: pool,
                vdev,
                force,
            };
            client.call_quietly(out, method::POOL_ADD_LOG, &params)?;
        }
        PoolCommand::Remove { pool, device } => {
            let params = DeviceParams {
                name: pool,
                device: device_arg(&device)?,
            };
            client.call_quietly(out, method::POOL_REMOVE, &params)?;
        }
        PoolCommand::Replace {
            force,
            pool,
            old,
            new,
        } => {
            let params = ReplaceParams {
                name: pool,
                old: device_arg(&old)?,
                new: absolute(Path::new(&new))?,
                force,
            };
            client.call_quietly(out, method::POOL_REPLACE, &params)?;
        }
        PoolCommand::Clear { pool, device } => {
            let params = ClearParams {
                name: pool,
                device: device.as_deref().map(device_arg).transpose()?,
            };
            client.call_quietly(out, method::POOL_CLEAR, &params)?;
        }
        PoolCommand::Iostat { verbose, args } => {
            let (pool, interval, count) = parse_iostat_args(&args)?;
            iostat(client, out, pool, interval, count, verbose)?;
        }
        PoolCommand::History { day, last } => {
            let v = client.call(
                method::STATS_HISTORY,
                &tarn_api::params::HistoryParams { day },
            )?;
            let mut points: Vec<tarn_api::params::HistoryPoint> =
                decode(method::STATS_HISTORY, v.clone())?;
            if let Some(n) = last {
                points.drain(..points.len().saturating_sub(n));
            }
            out.raw_or(&v, || render_history(&points))?;
        }
        PoolCommand::Sync { pool } => {
            let v = client.call(method::POOL_SYNC, &NameParams { name: pool.clone() })?;
            let synced: SyncResult = decode(method::POOL_SYNC, v.clone())?;
            out.raw_or(&v, || format!("{pool}: committed txg {}\n", synced.txg))?;
        }
        PoolCommand::Inject {
            pool,
            device,
            kind,
            probability,
            latency_ms,
            clear,
        } => {
            let fault = match (kind, clear) {
                (None, true) => None,
                (Some(k), false) => {
                    let kind = FaultKind::parse(&k).ok_or_else(|| {
                        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                        anyhow!("unknown fault '{k}'; one of: {}", names.join(", "))
                    })?;
                    Some(Fault {
                        kind,
                        probability,
                        range: None,
                        latency_ms,
                    })
                }
                _ => bail!("give a fault kind, or --clear"),
            };
            let params = InjectParams {
                name: pool,
                device: device_arg(&device)?,
                fault,
            };
            let v = client.call(method::POOL_INJECT, &params)?;
            let now: Vec<Fault> = decode(method::POOL_INJECT, v.clone())?;
            out.raw_or(&v, || {
                if now.is_empty() {
                    format!("{device}: no faults\n")
                } else {
                    let list: Vec<String> = now
                        .iter()
                        .map(|f| format!("{} ({:.0}%)", f.kind.name(), f.probability * 100.0))
                        .collect();
                    format!("{device}: {}\n", list.join(", "))
                }
            })?;
        }
    }
    Ok(())
}

fn iostat(
    client: &mut Session,
    out: &Out,
    pool: Option<String>,
    interval: Option<f64>,
    count: Option<u64>,
    verbose: bool,
) -> anyhow::Result<()> {
    let params = OptionalNameParams { name: pool };
    let reports = match (interval, count) {
        (None, _) => 1,
        (Some(_), Some(n)) => n,
        (Some(_), None) => u64::MAX,
    };
    let mut previous: Option<(Vec<IostatEntry>, Instant)> = None;
    let mut previous_cache: Option<CacheCounters> = None;
    for i in 0..reports {
        if i > 0 {
            if let Some(secs) = interval {
                thread::sleep(Duration::from_secs_f64(secs));
            }
        }
        let v = client.call(method::POOL_IOSTAT, &params)?;
        let now = Instant::now();
        let entries: Vec<IostatEntry> = decode(method::POOL_IOSTAT, v.clone())?;
        // The cache is the daemon's, shared by its pools: any pool's status
        // carries its counters.
        let cache = if verbose {
            let s = client.call(method::POOL_STATUS, &params)?;
            let pools: Vec<PoolStatus> = decode(method::POOL_STATUS, s)?;
            pools.iter().find_map(|p| p.cache)
        } else {
            None
        };
        out.raw_or(&v, || {
            let elapsed = previous.as_ref().map(|(_, at)| now.duration_since(*at));
            let prev = previous
                .as_ref()
                .zip(elapsed)
                .map(|((p, _), e)| (p.as_slice(), e));
            let mut text = render::render_iostat(&entries, prev);
            if let Some(c) = &cache {
                text.push('\n');
                let before = previous_cache.as_ref().zip(elapsed);
                text.push_str(&render::render_cache_iostat(c, before));
            }
            text
        })?;
        previous = Some((entries, now));
        previous_cache = cache;
    }
    Ok(())
}

/// Polls the pool's status once a second until its scrub has ended; draws a
/// progress bar on a terminal, or a line every ten seconds otherwise.
fn wait_for_scrub(
    client: &mut Session,
    pool: &str,
    started_unix: u64,
) -> anyhow::Result<ScanStatus> {
    const LOG_EVERY: Duration = Duration::from_secs(10);
    let tty = std::io::stderr().is_terminal();
    let mut last_log: Option<Instant> = None;
    let params = OptionalNameParams {
        name: Some(pool.to_string()),
    };
    let finish_line = |drawn: bool| {
        if drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    };
    let mut drawn = false;
    loop {
        let v = client.call(method::POOL_STATUS, &params)?;
        let pools: Vec<PoolStatus> = decode(method::POOL_STATUS, v)?;
        let status = pools
            .into_iter()
            .find(|p| p.name == pool)
            .ok_or_else(|| anyhow!("pool {pool} disappeared while waiting for its scrub"))?;
        let Some(scan) = status.scan else {
            finish_line(drawn);
            bail!(
                "pool {pool} reports no scrub; it may have been canceled or the pool re-imported"
            );
        };
        let ours = scan.kind == ScanKind::Scrub && scan.started_unix >= started_unix;
        let ended = matches!(scan.state, ScanState::Finished | ScanState::Canceled);
        if ended {
            finish_line(drawn);
            if ours {
                return Ok(scan);
            }
            bail!(
                "pool {pool} no longer reports the scrub that was started; its last scan is: {}",
                render::scan_text(&scan)
            );
        }
        if tty {
            let _ = write!(
                std::io::stderr(),
                "\r{}\x1b[K",
                render::progress_line(&scan)
            );
            drawn = true;
        } else if last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            let pct = if scan.total_bytes == 0 {
                0.0
            } else {
                scan.examined_bytes as f64 * 100.0 / scan.total_bytes as f64
            };
            let eta = scan
                .eta_secs
                .map_or_else(|| "unknown".to_string(), render::format_duration);
            let _ = writeln!(
                std::io::stderr(),
                "{pool}: {}{} {pct:.1}% done, {} of {} at {}, {eta} to go",
                match scan.kind {
                    ScanKind::Scrub => "scrub",
                    ScanKind::Resilver => "resilver",
                },
                if scan.state == ScanState::Paused {
                    " (paused)"
                } else {
                    ""
                },
                render::format_size(scan.examined_bytes),
                render::format_size(scan.total_bytes),
                render::format_rate(scan.rate_bytes_per_sec),
            );
            last_log = Some(Instant::now());
        }
        let _ = std::io::stderr().flush();
        thread::sleep(Duration::from_secs(1));
    }
}

/// `tarn pool history`: a row per point and pool, then per protocol.
fn render_history(points: &[tarn_api::params::HistoryPoint]) -> String {
    if points.is_empty() {
        return "no history yet: the daemon samples every 10 seconds\n".into();
    }
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    let mut rows = Vec::new();
    for p in points {
        let time = tarn_api::time::utc_minutes(p.t);
        for r in &p.pools {
            rows.push(vec![
                time.clone(),
                r.pool.clone(),
                format!("{:.0}", r.read_iops),
                format!("{:.0}", r.write_iops),
                format!("{:.1}", r.read_bytes_per_sec / 1e6),
                format!("{:.1}", r.write_bytes_per_sec / 1e6),
                ms(r.read_latency_ms),
                ms(r.write_latency_ms),
                p.cache_hit_ratio
                    .map_or("-".into(), |h| format!("{:.0}%", h * 100.0)),
            ]);
        }
        for r in &p.protocols {
            rows.push(vec![
                time.clone(),
                r.protocol.clone(),
                format!("{:.0} req/s", r.requests_per_sec),
                String::new(),
                String::new(),
                String::new(),
                ms(r.latency_ms),
                String::new(),
                String::new(),
            ]);
        }
    }
    crate::render::table(
        &[
            "TIME (UTC)",
            "POOL/PROTO",
            "READ/S",
            "WRITE/S",
            "READ MB/S",
            "WRITE MB/S",
            "READ MS",
            "WRITE MS",
            "CACHE HITS",
        ],
        &rows,
        &[0, 1],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn create_request_from_words_and_options() {
        let req = build_create(
            "tank".into(),
            &words("mirror a /b"),
            vec![("ashift".into(), "12".into())],
            &["compression=lz4".into(), "checksum=xxh3".into()],
            true,
        )
        .unwrap();
        assert_eq!(req.ashift, Some(12));
        assert!(req.force);
        assert_eq!(req.properties["compression"], "lz4");
        assert!(Path::new(&req.vdevs[0].devices[0]).is_absolute());
        assert!(req.vdevs[0].devices[0].ends_with("/a"));
        assert_eq!(req.vdevs[0].devices[1], "/b");

        let err = build_create("tank".into(), &words("a"), vec![], &["x".into()], false);
        assert!(err.unwrap_err().to_string().contains("expected PROP=VALUE"));
        let err = build_create(
            "tank".into(),
            &words("a"),
            vec![("autoexpand".into(), "on".into())],
            &[],
            false,
        );
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("unknown pool property"));
        let err = build_create("mirror".into(), &words("a b"), vec![], &[], false);
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("forget the pool name"));
    }

    #[test]
    fn iostat_arguments() {
        assert_eq!(parse_iostat_args(&[]).unwrap(), (None, None, None));
        assert_eq!(
            parse_iostat_args(&words("tank 5")).unwrap(),
            (Some("tank".into()), Some(5.0), None)
        );
        assert_eq!(
            parse_iostat_args(&words("2 3")).unwrap(),
            (None, Some(2.0), Some(3))
        );
        assert!(parse_iostat_args(&words("tank other")).is_err());
        assert!(parse_iostat_args(&words("tank 0")).is_err());
        assert!(parse_iostat_args(&words("1 2.5")).is_err());
    }
}
