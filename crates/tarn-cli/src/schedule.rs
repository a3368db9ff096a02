//! `tarn schedule ...`: snapshot policies with retention, scrub,
//! self-test and replication schedules, stored in the pool and run by the
//! daemon.

use anyhow::{bail, Context};
use clap::Subcommand;
use tarn_api::method;
use tarn_api::params::{NoParams, ScheduleAddParams, ScheduleParams};
use tarn_api::schedule::{
    Every, Retention, RunRecord, Schedule, ScheduleInfo, ScheduleKind, SelfTest,
};

use crate::render::table;
use crate::session::{decode, Out, Session};

/// `tarn schedule ...`.
// Parsed once per process: the size of `Add` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Add (or replace) a schedule: `tarn schedule add photos snapshot
    /// tank/photos -r --keep hourly=24,daily=30,weekly=8,monthly=12`, or
    /// `tarn schedule add scrub-tank scrub tank --every monthly --at 2
    /// --pause 8-23`, `tarn schedule add disks selftest tank --test short
    /// --every weekly`, or `tarn schedule add offsite replicate
    /// tank/photos --to s3://bucket/photos --env-file /etc/tarn/s3.env
    /// --every daily --at 1`. Times are UTC
    Add {
        /// Schedule name (unique in its pool)
        name: String,
        /// What it does: `snapshot`, `scrub`, `selftest` or `replicate`
        kind: String,
        /// The dataset to snapshot or replicate, or the pool to scrub or
        /// self-test
        target: String,
        /// snapshot: the datasets below the target too
        #[arg(short = 'r', long)]
        recursive: bool,
        /// snapshot: how many to keep of each period:
        /// hourly=N,daily=N,weekly=N,monthly=N,yearly=N (the finest one
        /// kept says how often a snapshot is taken)
        #[arg(long, value_name = "PERIOD=N,...")]
        keep: Option<String>,
        /// snapshot: the names' prefix (only snapshots with it are
        /// pruned); replicate: send the newest snapshot with it
        #[arg(long, default_value = "auto")]
        prefix: String,
        /// replicate: send the newest snapshot whatever its name
        #[arg(long, conflicts_with = "prefix")]
        any_snapshot: bool,
        /// scrub (monthly by default), selftest (weekly), replicate
        /// (daily): hourly (replicate only), daily, weekly or monthly
        #[arg(long, value_name = "PERIOD")]
        every: Option<String>,
        /// scrub, selftest, replicate: not before this hour of the day (0
        /// to 23, UTC)
        #[arg(long, value_name = "HOUR")]
        at: Option<u8>,
        /// selftest: short or long
        #[arg(long, value_name = "TEST", default_value = "short")]
        test: String,
        /// replicate: where, tarn://HOST[:PORT]/POOL/DATASET or
        /// s3://BUCKET/PREFIX
        #[arg(long, value_name = "URL")]
        to: Option<String>,
        /// replicate to tarn://: the file with the receiver's token
        #[arg(long, value_name = "FILE")]
        token_file: Option<std::path::PathBuf>,
        /// replicate to tarn://: the SHA-256 of the receiver's certificate
        #[arg(long, value_name = "SHA256")]
        fingerprint: Option<String>,
        /// replicate to s3://: a file (mode 0600) of NAME=VALUE lines with
        /// the store's AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
        /// and TARN_S3_ENDPOINT; the daemon reads it at each run
        #[arg(long, value_name = "FILE")]
        env_file: Option<std::path::PathBuf>,
        /// scrub: pause a running scrub in these hours, e.g. 8-23 (UTC;
        /// 22-6 wraps past midnight)
        #[arg(long, value_name = "FROM-TO")]
        pause: Option<String>,
    },
    /// Remove a schedule (its snapshots stay)
    Del {
        /// The pool [default: the one with that schedule]
        #[arg(long)]
        pool: Option<String>,
        /// Schedule name
        name: String,
    },
    /// List schedules with their last run and when they are next due
    List,
    /// Show a schedule's latest runs with their outcomes
    Runs {
        /// The pool [default: the one with that schedule]
        #[arg(long)]
        pool: Option<String>,
        /// Schedule name
        name: String,
    },
    /// Run a schedule now, whether due or not (it counts as this period's
    /// run)
    RunNow {
        /// The pool [default: the one with that schedule]
        #[arg(long)]
        pool: Option<String>,
        /// Schedule name
        name: String,
    },
}

/// Parses `hourly=24,daily=30,...`.
fn parse_keep(s: &str) -> anyhow::Result<Retention> {
    let mut k = Retention::default();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (p, n) = part
            .split_once('=')
            .with_context(|| format!("--keep {s}: use PERIOD=N, e.g. daily=30"))?;
        let n: u32 = n
            .parse()
            .with_context(|| format!("--keep {s}: '{n}' is not a count"))?;
        let slot = match p {
            "hourly" => &mut k.hourly,
            "daily" => &mut k.daily,
            "weekly" => &mut k.weekly,
            "monthly" => &mut k.monthly,
            "yearly" => &mut k.yearly,
            other => bail!(
                "--keep {s}: unknown period '{other}' (hourly, daily, weekly, monthly, yearly)"
            ),
        };
        *slot = n;
    }
    Ok(k)
}

/// Parses `8-23`.
fn parse_pause(s: &str) -> anyhow::Result<(u8, u8)> {
    let (a, b) = s
        .split_once('-')
        .with_context(|| format!("--pause {s}: use FROM-TO hours, e.g. 8-23"))?;
    let h = |x: &str| -> anyhow::Result<u8> {
        x.trim()
            .parse()
            .with_context(|| format!("--pause {s}: '{x}' is not an hour"))
    };
    Ok((h(a)?, h(b)?))
}

/// Parses `--every`.
fn parse_every(s: Option<&str>, default: Every) -> anyhow::Result<Every> {
    match s {
        None => Ok(default),
        Some(name) => Every::parse(name)
            .with_context(|| format!("--every {name}: hourly, daily, weekly or monthly")),
    }
}

/// A file the daemon reads, as an absolute path.
fn absolute(flag: &str, p: Option<std::path::PathBuf>) -> anyhow::Result<Option<String>> {
    let Some(p) = p else {
        return Ok(None);
    };
    let abs = std::path::absolute(&p).with_context(|| format!("{flag} {}", p.display()))?;
    abs.to_str()
        .map(|s| Some(s.to_string()))
        .with_context(|| format!("{flag} {}: not UTF-8", p.display()))
}

fn pool_of(target: &str) -> String {
    target.split('/').next().unwrap_or(target).to_string()
}

fn describe(k: &ScheduleKind) -> (String, String) {
    match k {
        ScheduleKind::Snapshot {
            dataset,
            recursive,
            keep,
            prefix,
        } => {
            let counts: Vec<String> = [
                ("hourly", keep.hourly),
                ("daily", keep.daily),
                ("weekly", keep.weekly),
                ("monthly", keep.monthly),
                ("yearly", keep.yearly),
            ]
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(p, n)| format!("{p}={n}"))
            .collect();
            (
                format!("snapshot {dataset}{}", if *recursive { " -r" } else { "" }),
                format!("keep {} ({prefix}-*)", counts.join(",")),
            )
        }
        ScheduleKind::Scrub {
            every,
            at_hour,
            pause,
        } => {
            let pause = pause
                .map(|(a, b)| format!(", paused {a:02}-{b:02}h"))
                .unwrap_or_default();
            (
                "scrub".to_string(),
                format!("{} from {at_hour:02}:00{pause}", every.name()),
            )
        }
        ScheduleKind::Selftest {
            test,
            every,
            at_hour,
        } => (
            format!("{} self-test", test.name()),
            format!("{} from {at_hour:02}:00", every.name()),
        ),
        ScheduleKind::Replicate {
            dataset,
            to,
            prefix,
            every,
            at_hour,
            ..
        } => {
            let which = match prefix {
                Some(p) => format!("newest {p}-*"),
                None => "newest".to_string(),
            };
            let when = match every {
                Every::Hourly => "hourly".to_string(),
                e => format!("{} from {at_hour:02}:00", e.name()),
            };
            (
                format!("replicate {dataset} to {to}"),
                format!("{which}, {when}"),
            )
        }
    }
}

fn time(t: u64) -> String {
    tarn_api::time::utc_minutes(t)
}

/// `tarn schedule list`.
pub fn render_schedules(list: &[ScheduleInfo]) -> String {
    if list.is_empty() {
        return "no schedules; add one with `tarn schedule add NAME snapshot DATASET --keep \
                daily=30`\n"
            .into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            let (what, how) = describe(&i.schedule.kind);
            let last = match i.runs.last() {
                None => "never".to_string(),
                Some(r) => format!(
                    "{} {}",
                    time(r.started_unix),
                    if r.ok { "ok" } else { "FAILED" }
                ),
            };
            vec![
                i.schedule.name.clone(),
                i.schedule.pool.clone(),
                what,
                how,
                last,
                i.next_due_unix.map(time).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        &["NAME", "POOL", "WHAT", "HOW", "LAST RUN", "NEXT DUE"],
        &rows,
        &[0, 1, 2, 3, 4, 5],
    )
}

fn render_runs(runs: &[RunRecord]) -> String {
    if runs.is_empty() {
        return "it has not run yet\n".into();
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                time(r.started_unix),
                if r.ok { "ok" } else { "FAILED" }.to_string(),
                r.detail.clone(),
            ]
        })
        .collect();
    table(&["STARTED", "OUTCOME", "WHAT"], &rows, &[0, 1, 2])
}

pub(crate) fn schedule_command(
    client: &mut Session,
    out: &Out,
    cmd: ScheduleCommand,
) -> anyhow::Result<()> {
    match cmd {
        ScheduleCommand::Add {
            name,
            kind,
            target,
            recursive,
            keep,
            prefix,
            any_snapshot,
            every,
            at,
            pause,
            test,
            to,
            token_file,
            fingerprint,
            env_file,
        } => {
            let replicate_only = to.is_some()
                || token_file.is_some()
                || fingerprint.is_some()
                || env_file.is_some()
                || any_snapshot;
            if kind != "replicate" && replicate_only {
                bail!(
                    "--to, --token-file, --fingerprint, --env-file and --any-snapshot are for \
                     replicate schedules"
                );
            }
            if kind != "selftest" && test != "short" {
                bail!("--test is for selftest schedules");
            }
            if kind != "scrub" && pause.is_some() {
                bail!("--pause is for scrub schedules");
            }
            let kind = match kind.as_str() {
                "snapshot" => {
                    if every.is_some() || at.is_some() {
                        bail!(
                            "a snapshot schedule's --keep says when it runs, not --every or --at"
                        );
                    }
                    let keep = keep.context(
                        "a snapshot schedule needs --keep, e.g. hourly=24,daily=30,weekly=8,monthly=12",
                    )?;
                    ScheduleKind::Snapshot {
                        dataset: target.clone(),
                        recursive,
                        keep: parse_keep(&keep)?,
                        prefix,
                    }
                }
                "scrub" => {
                    if keep.is_some() || recursive {
                        bail!("--keep and -r are for snapshot schedules");
                    }
                    if target.contains('/') {
                        bail!("a scrub schedule names a pool, not '{target}'");
                    }
                    ScheduleKind::Scrub {
                        every: parse_every(every.as_deref(), Every::Monthly)?,
                        at_hour: at.unwrap_or(0),
                        pause: pause.as_deref().map(parse_pause).transpose()?,
                    }
                }
                "selftest" => {
                    if keep.is_some() || recursive {
                        bail!("--keep and -r are for snapshot schedules");
                    }
                    if target.contains('/') {
                        bail!("a self-test schedule names a pool, not '{target}'");
                    }
                    ScheduleKind::Selftest {
                        test: SelfTest::parse(&test)
                            .with_context(|| format!("--test {test}: short or long"))?,
                        every: parse_every(every.as_deref(), Every::Weekly)?,
                        at_hour: at.unwrap_or(0),
                    }
                }
                "replicate" => {
                    if keep.is_some() || recursive {
                        bail!("--keep and -r are for snapshot schedules");
                    }
                    ScheduleKind::Replicate {
                        dataset: target.clone(),
                        to: to.context(
                            "a replicate schedule needs --to tarn://HOST/POOL/DATASET or \
                             --to s3://BUCKET/PREFIX",
                        )?,
                        prefix: (!any_snapshot).then_some(prefix),
                        every: parse_every(every.as_deref(), Every::Daily)?,
                        at_hour: at.unwrap_or(0),
                        token_file: absolute("--token-file", token_file)?,
                        fingerprint,
                        env_file: absolute("--env-file", env_file)?,
                    }
                }
                other => bail!(
                    "'{other}': a schedule is a `snapshot`, `scrub`, `selftest` or `replicate` \
                     schedule"
                ),
            };
            let schedule = Schedule {
                name,
                pool: pool_of(&target),
                kind,
            };
            tarn_api::schedule::check_schedule(&schedule).map_err(anyhow::Error::msg)?;
            client.call_quietly(out, method::SCHEDULE_ADD, &ScheduleAddParams { schedule })?;
        }
        ScheduleCommand::Del { pool, name } => {
            client.call_quietly(out, method::SCHEDULE_DEL, &ScheduleParams { pool, name })?;
        }
        ScheduleCommand::List => {
            let v = client.call(method::SCHEDULE_LIST, &NoParams {})?;
            let list: Vec<ScheduleInfo> = decode(method::SCHEDULE_LIST, v.clone())?;
            out.raw_or(&v, || render_schedules(&list))?;
        }
        ScheduleCommand::Runs { pool, name } => {
            let v = client.call(method::SCHEDULE_LIST, &NoParams {})?;
            let list: Vec<ScheduleInfo> = decode(method::SCHEDULE_LIST, v)?;
            let found: Vec<&ScheduleInfo> = list
                .iter()
                .filter(|i| {
                    i.schedule.name == name && pool.as_ref().is_none_or(|p| *p == i.schedule.pool)
                })
                .collect();
            let [one] = found.as_slice() else {
                bail!("no single schedule '{name}' (give --pool when several pools have one)");
            };
            let v = serde_json::to_value(&one.runs)?;
            out.raw_or(&v, || render_runs(&one.runs))?;
        }
        ScheduleCommand::RunNow { pool, name } => {
            let v = client.call(method::SCHEDULE_RUN, &ScheduleParams { pool, name })?;
            let run: RunRecord = decode(method::SCHEDULE_RUN, v.clone())?;
            out.raw_or(&v, || {
                format!("{}: {}\n", if run.ok { "ok" } else { "FAILED" }, run.detail)
            })?;
            if !run.ok {
                bail!("the run failed: {}", run.detail);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_and_pause_parse() {
        let k = parse_keep("hourly=24,daily=30,weekly=8,monthly=12").unwrap();
        assert_eq!(
            (k.hourly, k.daily, k.weekly, k.monthly, k.yearly),
            (24, 30, 8, 12, 0)
        );
        for bad in ["hourly", "hourly=x", "minutely=5", "daily=-1"] {
            assert!(parse_keep(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_pause("8-23").unwrap(), (8, 23));
        assert_eq!(parse_pause("22-6").unwrap(), (22, 6));
        assert!(parse_pause("8").is_err());
        assert!(parse_pause("a-b").is_err());
    }
}
