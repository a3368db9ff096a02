//! `tarn schedule ...`: snapshot policies with retention and scrub
//! schedules, stored in the pool and run by the daemon.

use anyhow::{bail, Context};
use clap::Subcommand;
use tarn_api::method;
use tarn_api::params::{NoParams, ScheduleAddParams, ScheduleParams};
use tarn_api::schedule::{Every, Retention, RunRecord, Schedule, ScheduleInfo, ScheduleKind};

use crate::render::table;
use crate::session::{decode, Out, Session};

/// `tarn schedule ...`.
#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Add (or replace) a schedule: `tarn schedule add photos snapshot
    /// tank/photos -r --keep hourly=24,daily=30,weekly=8,monthly=12`, or
    /// `tarn schedule add scrub-tank scrub tank --every monthly --at 2
    /// --pause 8-23`. Times are UTC
    Add {
        /// Schedule name (unique in its pool)
        name: String,
        /// What it does: `snapshot` or `scrub`
        kind: String,
        /// The dataset to snapshot, or the pool to scrub
        target: String,
        /// snapshot: the datasets below the target too
        #[arg(short = 'r', long)]
        recursive: bool,
        /// snapshot: how many to keep of each period:
        /// hourly=N,daily=N,weekly=N,monthly=N,yearly=N (the finest one
        /// kept says how often a snapshot is taken)
        #[arg(long, value_name = "PERIOD=N,...")]
        keep: Option<String>,
        /// snapshot: the names' prefix (only snapshots with it are pruned)
        #[arg(long, default_value = "auto")]
        prefix: String,
        /// scrub: daily, weekly or monthly
        #[arg(long, value_name = "PERIOD")]
        every: Option<String>,
        /// scrub: not before this hour of the day (0 to 23, UTC)
        #[arg(long, value_name = "HOUR", default_value_t = 0)]
        at: u8,
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
            let every = match every {
                Every::Daily => "daily",
                Every::Weekly => "weekly",
                Every::Monthly => "monthly",
            };
            let pause = pause
                .map(|(a, b)| format!(", paused {a:02}-{b:02}h"))
                .unwrap_or_default();
            (
                "scrub".to_string(),
                format!("{every} from {at_hour:02}:00{pause}"),
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
            every,
            at,
            pause,
        } => {
            let kind = match kind.as_str() {
                "snapshot" => {
                    if every.is_some() || pause.is_some() {
                        bail!("--every and --pause are for scrub schedules");
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
                    let every = match every.as_deref() {
                        Some("daily") => Every::Daily,
                        Some("weekly") => Every::Weekly,
                        Some("monthly") | None => Every::Monthly,
                        Some(other) => bail!("--every {other}: daily, weekly or monthly"),
                    };
                    ScheduleKind::Scrub {
                        every,
                        at_hour: at,
                        pause: pause.as_deref().map(parse_pause).transpose()?,
                    }
                }
                other => bail!("'{other}': a schedule is a `snapshot` or a `scrub` schedule"),
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
