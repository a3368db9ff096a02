//! Schedules: snapshot policies with retention, scrubs, SMART self-tests
//! and replication, run by the daemon.
//!
//! # Long runs
//!
//! Snapshots, scrub starts and self-test starts take moments and run in
//! the scheduler's thread under `Pools::schedule_lock`, one at a time. A
//! replication may take hours: it runs `tarn replicate` (the command an
//! owner runs by hand) against the daemon's admin socket on a thread of
//! its own, after storing that it started (so it is not started again in
//! its period, nor while it runs: `Pools::long_runs`), and takes the lock
//! only to record its outcome. A daemon that stops does not wait for it:
//! the command loses its socket and ends, its outcome is not recorded,
//! and the next period's run (or `run-now`) resumes the transfer.
//!
//! # What is stored, and where
//!
//! A schedule is a configuration record (kind `schedule`) of the pool it
//! acts on, so it moves with the disks; what it did is a second record
//! (kind `schedrun`): when it last started and its latest 20 runs
//! with their outcomes. Both are the daemon's own types (golden tests pin
//! their JSON; see `docs/format.md`).
//!
//! # When a schedule runs: periods, not timers
//!
//! Time is cut into UTC periods: hours, days, weeks (from Monday), months
//! and years. A snapshot policy takes one snapshot per period of the
//! finest kind it keeps (hourly if it keeps hours, else daily, …); a scrub
//! schedule scrubs once per day, week or month, not before its hour. A
//! schedule is *due* when the period of the clock now is later than the
//! period of its last start. That one comparison gives the rules a NAS
//! needs: a run happens at most once per period, however often the
//! scheduler looks (every 30 seconds) or the daemon restarts; and after
//! downtime that skipped several periods, it runs once, not once per
//! missed period. A run by hand (`tarn schedule run-now`) counts as the
//! period's run. A new scrub schedule starts counting from when it was
//! added (no scrub at once); a new snapshot policy takes its first
//! snapshot at once.
//!
//! # What a snapshot policy keeps
//!
//! Snapshots are named `PREFIX-YYYY-MM-DD-HHMM` (UTC). Only snapshots of
//! the policy's dataset (and, recursive, of the datasets below) named
//! exactly so are ever pruned; snapshots taken by hand or by another
//! policy with another prefix are not touched, even one whose prefix
//! starts with this one's (`auto-daily` beside `auto`). For each period
//! kind with a count `n` (say daily = 30), the policy keeps the *first*
//! snapshot it has in each of the `n` most recent periods that have one;
//! what no period kind keeps is destroyed, except:
//!
//! - the newest snapshot of the policy (the base of the next incremental
//!   send);
//! - a snapshot with a hold (`tarn hold`; replication tools hold the
//!   last snapshot they sent, which is what the next incremental needs);
//! - a snapshot with clones (a destroy would fail anyway).
//!
//! Keeping the first of each period (not the last) means a daily snapshot,
//! once kept, never changes. The planning functions here are pure (clock
//! and snapshot list in, names out) and tested by simulating a year.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tarn_api::schedule::{
    Every, Retention, RunRecord, Schedule, ScheduleInfo, ScheduleKind, SelfTest,
};
use tarn_api::{ApiError, Backend};
use tarn_pool::Pool;

use crate::convert::ds_error;
use crate::pools::Pools;

/// Configuration-record kind of schedules.
pub const KIND_SCHEDULE: &str = "schedule";
/// Configuration-record kind of what schedules did.
pub const KIND_STATE: &str = "schedrun";
/// Runs kept per schedule (fewer if their lines are long: a record holds
/// at most 4 KiB).
pub const MAX_RUNS: usize = 20;
/// A run's line is cut to this many characters.
const MAX_DETAIL: usize = 160;

// ---------------------------------------------------------------------
// Records (the daemon's own types; JSON pinned by golden tests)

/// A schedule as stored (its pool is the pool it is stored in).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRecord {
    /// Name, unique in the pool.
    pub name: String,
    /// What it does.
    pub kind: KindRecord,
}

/// What a stored schedule does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum KindRecord {
    /// A snapshot policy.
    Snapshot {
        /// The dataset.
        dataset: String,
        /// The datasets below it too.
        recursive: bool,
        /// Counts per period: hourly, daily, weekly, monthly, yearly.
        keep: [u32; 5],
        /// Name prefix.
        prefix: String,
    },
    /// A scrub.
    Scrub {
        /// "daily", "weekly" or "monthly".
        every: String,
        /// Not before this UTC hour.
        at_hour: u8,
        /// UTC hours `[from, to)` in which a running scrub is paused.
        pause: Option<(u8, u8)>,
    },
    /// SMART self-tests of the pool's disks.
    Selftest {
        /// "short" or "long".
        test: String,
        /// "daily", "weekly" or "monthly".
        every: String,
        /// Not before this UTC hour.
        at_hour: u8,
    },
    /// Replication of the newest snapshot.
    Replicate {
        /// The dataset.
        dataset: String,
        /// Target URL (tarn:// or s3://).
        to: String,
        /// Only snapshots named `PREFIX-…`.
        prefix: Option<String>,
        /// "hourly", "daily", "weekly" or "monthly".
        every: String,
        /// Not before this UTC hour.
        at_hour: u8,
        /// tarn://: the token's file.
        token_file: Option<String>,
        /// tarn://: the receiver certificate's SHA-256.
        fingerprint: Option<String>,
        /// s3://: the credentials' file.
        env_file: Option<String>,
        /// The daemon that added it (its `node-id`): the credential files
        /// are that machine's, so only it runs the schedule.
        #[serde(default)]
        node: String,
    },
}

/// What a schedule did, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRecord {
    /// When it last started (Unix seconds); none: never.
    #[serde(default)]
    pub last_started_unix: Option<u64>,
    /// Latest runs, oldest first.
    #[serde(default)]
    pub runs: Vec<RunRec>,
}

/// One run, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRec {
    /// Start, Unix seconds.
    pub started_unix: u64,
    /// Succeeded.
    pub ok: bool,
    /// What it did or why it failed.
    pub detail: String,
}

impl From<&Schedule> for ScheduleRecord {
    fn from(s: &Schedule) -> Self {
        let kind = match &s.kind {
            ScheduleKind::Snapshot {
                dataset,
                recursive,
                keep,
                prefix,
            } => KindRecord::Snapshot {
                dataset: dataset.clone(),
                recursive: *recursive,
                keep: [
                    keep.hourly,
                    keep.daily,
                    keep.weekly,
                    keep.monthly,
                    keep.yearly,
                ],
                prefix: prefix.clone(),
            },
            ScheduleKind::Scrub {
                every,
                at_hour,
                pause,
            } => KindRecord::Scrub {
                every: every.name().to_string(),
                at_hour: *at_hour,
                pause: *pause,
            },
            ScheduleKind::Selftest {
                test,
                every,
                at_hour,
            } => KindRecord::Selftest {
                test: test.name().to_string(),
                every: every.name().to_string(),
                at_hour: *at_hour,
            },
            ScheduleKind::Replicate {
                dataset,
                to,
                prefix,
                every,
                at_hour,
                token_file,
                fingerprint,
                env_file,
            } => KindRecord::Replicate {
                dataset: dataset.clone(),
                to: to.clone(),
                prefix: prefix.clone(),
                every: every.name().to_string(),
                at_hour: *at_hour,
                token_file: token_file.clone(),
                fingerprint: fingerprint.clone(),
                env_file: env_file.clone(),
                node: String::new(),
            },
        };
        ScheduleRecord {
            name: s.name.clone(),
            kind,
        }
    }
}

impl ScheduleRecord {
    /// The API's view of it, in `pool`; an error for a record this build
    /// cannot read.
    pub fn to_api(&self, pool: &str) -> Result<Schedule, String> {
        let kind = match &self.kind {
            KindRecord::Snapshot {
                dataset,
                recursive,
                keep,
                prefix,
            } => ScheduleKind::Snapshot {
                dataset: dataset.clone(),
                recursive: *recursive,
                keep: retention(keep),
                prefix: prefix.clone(),
            },
            KindRecord::Scrub {
                every,
                at_hour,
                pause,
            } => ScheduleKind::Scrub {
                every: Every::parse(every).ok_or_else(|| format!("unknown period '{every}'"))?,
                at_hour: *at_hour,
                pause: *pause,
            },
            KindRecord::Selftest {
                test,
                every,
                at_hour,
            } => ScheduleKind::Selftest {
                test: SelfTest::parse(test).ok_or_else(|| format!("unknown self-test '{test}'"))?,
                every: Every::parse(every).ok_or_else(|| format!("unknown period '{every}'"))?,
                at_hour: *at_hour,
            },
            KindRecord::Replicate {
                dataset,
                to,
                prefix,
                every,
                at_hour,
                token_file,
                fingerprint,
                env_file,
                node: _,
            } => ScheduleKind::Replicate {
                dataset: dataset.clone(),
                to: to.clone(),
                prefix: prefix.clone(),
                every: Every::parse(every).ok_or_else(|| format!("unknown period '{every}'"))?,
                at_hour: *at_hour,
                token_file: token_file.clone(),
                fingerprint: fingerprint.clone(),
                env_file: env_file.clone(),
            },
        };
        Ok(Schedule {
            name: self.name.clone(),
            pool: pool.to_string(),
            kind,
        })
    }
}

fn retention(k: &[u32; 5]) -> Retention {
    Retention {
        hourly: k[0],
        daily: k[1],
        weekly: k[2],
        monthly: k[3],
        yearly: k[4],
    }
}

// ---------------------------------------------------------------------
// Time: UTC periods

/// A kind of period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Period {
    /// An hour.
    Hour,
    /// A day.
    Day,
    /// A week, Monday to Sunday.
    Week,
    /// A calendar month.
    Month,
    /// A calendar year.
    Year,
}

const DAY: u64 = 86_400;

use tarn_api::time::{civil_from_days as civil, days_from_civil};

/// The start (Unix seconds, UTC) of the period of kind `p` that holds `t`.
pub fn bucket(p: Period, t: u64) -> u64 {
    let days = t / DAY;
    match p {
        Period::Hour => t - t % 3600,
        Period::Day => days * DAY,
        // 1970-01-01 was a Thursday: Monday is 3 days before a multiple
        // of 7 (days + 3) % 7 after it. The week that holds the epoch
        // began before it, so its first four days count from the epoch
        // (a clock not yet set on a board without one reads 1970).
        Period::Week => days.saturating_sub((days + 3) % 7) * DAY,
        Period::Month => {
            let (y, m, _) = civil(days);
            days_from_civil(y, m, 1) * DAY
        }
        Period::Year => {
            let (y, _, _) = civil(days);
            days_from_civil(y, 1, 1) * DAY
        }
    }
}

/// The start of the period after the one that holds `t`.
pub fn next_bucket(p: Period, t: u64) -> u64 {
    let longest = match p {
        Period::Hour => 3600,
        Period::Day => DAY,
        Period::Week => 7 * DAY,
        Period::Month => 31 * DAY,
        Period::Year => 366 * DAY,
    };
    bucket(p, bucket(p, t) + longest)
}

/// The hour of the day of `t` (UTC).
fn hour_of(t: u64) -> u8 {
    ((t % DAY) / 3600) as u8
}

/// `PREFIX-YYYY-MM-DD-HHMM` of `t` (UTC).
pub fn snapshot_name(prefix: &str, t: u64) -> String {
    let (date, h, min) = date_hour_minute(t);
    format!("{prefix}-{date}-{h:02}{min:02}")
}

/// `YYYY-MM-DD HH:MM UTC` of `t`, for a run's detail.
fn iso_minute(t: u64) -> String {
    let (date, h, min) = date_hour_minute(t);
    format!("{date} {h:02}:{min:02} UTC")
}

/// `YYYY-MM-DD`, the hour and the minute of `t` (UTC).
fn date_hour_minute(t: u64) -> (String, u64, u64) {
    let (y, m, d) = civil(t / DAY);
    let s = t % DAY;
    (format!("{y:04}-{m:02}-{d:02}"), s / 3600, s / 60 % 60)
}

/// True when `short` (a snapshot's name after the `@`) is one a policy
/// with `prefix` takes and prunes: the prefix, a dash and a time as
/// [`snapshot_name`] writes it, nothing more. A policy `auto` must not
/// prune the snapshots of a policy `auto-daily` on the same dataset.
pub fn is_policy_snapshot(short: &str, prefix: &str) -> bool {
    let Some(time) = short.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let b = time.as_bytes();
    b.len() == "YYYY-MM-DD-HHMM".len()
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 | 10 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

// ---------------------------------------------------------------------
// Planning (pure)

fn periods(k: &Retention) -> [(Period, u32); 5] {
    [
        (Period::Hour, k.hourly),
        (Period::Day, k.daily),
        (Period::Week, k.weekly),
        (Period::Month, k.monthly),
        (Period::Year, k.yearly),
    ]
}

/// The finest period a retention keeps, which says how often a policy
/// takes snapshots.
pub fn finest(k: &Retention) -> Option<Period> {
    periods(k).into_iter().find(|(_, n)| *n > 0).map(|(p, _)| p)
}

fn every_period(e: Every) -> Period {
    match e {
        Every::Hourly => Period::Hour,
        Every::Daily => Period::Day,
        Every::Weekly => Period::Week,
        Every::Monthly => Period::Month,
    }
}

/// How often, and from which hour of the day, a scrub, self-test or
/// replication schedule runs; none for a snapshot policy.
fn periodic(kind: &ScheduleKind) -> Option<(Period, u8)> {
    match kind {
        ScheduleKind::Snapshot { .. } => None,
        ScheduleKind::Scrub { every, at_hour, .. }
        | ScheduleKind::Selftest { every, at_hour, .. }
        | ScheduleKind::Replicate { every, at_hour, .. } => {
            let p = every_period(*every);
            Some((p, if p == Period::Hour { 0 } else { *at_hour }))
        }
    }
}

/// Whether a schedule that last started at `last` has not run in the
/// period of kind `p` that holds `now`: it started in an earlier one, or
/// more than an hour after `now` for an hourly one, a day for the others
/// (the clock was ahead, a board before its time was set or a clock kept
/// in local time, and was set back: due rather than idle until the clock
/// catches up, which for hourly snapshots would be hours without one; a
/// step back of seconds, as time synchronisation makes, is no new period,
/// nor is a step of hours a new day's scrub).
fn before_period(p: Period, last: u64, now: u64) -> bool {
    let ahead = if p == Period::Hour { 3600 } else { DAY };
    bucket(p, last) < bucket(p, now) || last > now.saturating_add(ahead)
}

/// Whether a schedule last started at `last` is due at `now`.
pub fn due(kind: &ScheduleKind, last: Option<u64>, now: u64) -> bool {
    match (kind, periodic(kind)) {
        (ScheduleKind::Snapshot { keep, .. }, _) => match finest(keep) {
            None => false,
            Some(p) => last.is_none_or(|l| before_period(p, l, now)),
        },
        (_, Some((p, at_hour))) => {
            hour_of(now) >= at_hour && last.is_none_or(|l| before_period(p, l, now))
        }
        (_, None) => false,
    }
}

/// When a schedule last started at `last` is next due (as far as the
/// clock at `now` says).
pub fn next_due(kind: &ScheduleKind, last: Option<u64>, now: u64) -> Option<u64> {
    if due(kind, last, now) {
        return Some(now);
    }
    match (kind, periodic(kind)) {
        (ScheduleKind::Snapshot { keep, .. }, _) => {
            finest(keep).map(|p| next_bucket(p, last.unwrap_or(now)))
        }
        (_, Some((p, at_hour))) => {
            let start = match last {
                Some(l) if bucket(p, l) == bucket(p, now) => next_bucket(p, now),
                _ => bucket(p, now),
            };
            Some(start + u64::from(at_hour) * 3600)
        }
        (_, None) => None,
    }
}

/// Whether `now` is in the pause hours `[from, to)` (which may wrap past
/// midnight, e.g. 22 to 6).
pub fn paused_at(pause: Option<(u8, u8)>, now: u64) -> bool {
    let Some((from, to)) = pause else {
        return false;
    };
    let h = hour_of(now);
    if from < to {
        from <= h && h < to
    } else {
        h >= from || h < to
    }
}

/// A snapshot of a policy, for pruning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snap {
    /// Full name (`tank/a@auto-…`).
    pub name: String,
    /// Creation time.
    pub creation: u64,
    /// Creation txg (orders snapshots of one second).
    pub txg: u64,
}

/// The snapshots the retention `keep` keeps of `snaps` (one dataset's
/// snapshots of one policy): the first of each of the most recent periods,
/// per period kind, and the newest.
pub fn kept(keep: &Retention, snaps: &[Snap]) -> BTreeSet<String> {
    let mut sorted: Vec<&Snap> = snaps.iter().collect();
    sorted.sort_by_key(|s| (s.creation, s.txg));
    let mut out = BTreeSet::new();
    // The newest is the last one taken (by txg), whatever the clock said
    // when each was taken: after the clock was far ahead and set back,
    // the snapshot just taken is the next incremental's base, not one
    // dated in the future.
    if let Some(newest) = snaps.iter().max_by_key(|s| (s.txg, s.creation)) {
        out.insert(newest.name.clone());
    }
    for (p, n) in periods(keep) {
        if n == 0 {
            continue;
        }
        let mut first: BTreeMap<u64, &str> = BTreeMap::new();
        for s in &sorted {
            first.entry(bucket(p, s.creation)).or_insert(&s.name);
        }
        for name in first.values().rev().take(n as usize) {
            out.insert(name.to_string());
        }
    }
    out
}

/// What pruning destroys of `snaps`: what the retention does not keep and
/// `protected` (held, cloned) does not save.
pub fn prune(keep: &Retention, snaps: &[Snap], protected: impl Fn(&str) -> bool) -> Vec<String> {
    let keep = kept(keep, snaps);
    let mut gone: Vec<&Snap> = snaps
        .iter()
        .filter(|s| !keep.contains(&s.name) && !protected(&s.name))
        .collect();
    gone.sort_by_key(|s| (s.creation, s.txg));
    gone.into_iter().map(|s| s.name.clone()).collect()
}

// ---------------------------------------------------------------------
// Storage

fn decode<T: serde::de::DeserializeOwned>(kind: &str, name: &str, v: &[u8]) -> Result<T, String> {
    serde_json::from_slice(v).map_err(|e| format!("{kind} '{name}' cannot be read: {e}"))
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::internal(e.to_string()))
}

/// Points the snapshot and replication schedules of dataset `old`, and of
/// the datasets below it, at their names after a rename to `new` (a
/// snapshot's rename changes none), so that a renamed dataset keeps its
/// policies. Returns the schedules changed. The caller holds
/// `Pools::schedule_lock`.
pub fn follow_rename(pool: &Pool, old: &str, new: &str) -> Result<Vec<String>, ApiError> {
    if old.contains('@') {
        return Ok(Vec::new());
    }
    let moved = |d: &str| -> Option<String> {
        let rest = d.strip_prefix(old)?;
        (rest.is_empty() || rest.starts_with('/')).then(|| format!("{new}{rest}"))
    };
    let mut changed = Vec::new();
    for (mut rec, _) in stored(pool)? {
        let dataset = match &mut rec.kind {
            KindRecord::Snapshot { dataset, .. } | KindRecord::Replicate { dataset, .. } => dataset,
            KindRecord::Scrub { .. } | KindRecord::Selftest { .. } => continue,
        };
        let Some(to) = moved(dataset) else { continue };
        *dataset = to;
        tarn_dataset::config_put(pool, KIND_SCHEDULE, &rec.name, &encode(&rec)?)
            .map_err(ds_error)?;
        changed.push(rec.name);
    }
    Ok(changed)
}

/// The schedules stored in `pool`, each with its state; a record that
/// cannot be read is left out (see [`stored_all`]).
pub fn stored(pool: &Pool) -> Result<Vec<(ScheduleRecord, StateRecord)>, ApiError> {
    Ok(stored_all(pool)?.0)
}

/// A pool's stored schedules: the readable ones with their state, and
/// the names of those this build cannot decode with the reason.
pub type Stored = (Vec<(ScheduleRecord, StateRecord)>, Vec<(String, String)>);

/// The schedules stored in `pool`, each with its state, and the names of
/// the records this build cannot decode with the reason (a newer tarn may
/// have written them).
pub fn stored_all(pool: &Pool) -> Result<Stored, ApiError> {
    let states: BTreeMap<String, Vec<u8>> = tarn_dataset::config_list(pool, KIND_STATE)
        .map_err(ds_error)?
        .into_iter()
        .collect();
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for (name, v) in tarn_dataset::config_list(pool, KIND_SCHEDULE).map_err(ds_error)? {
        match decode::<ScheduleRecord>(KIND_SCHEDULE, &name, &v) {
            Ok(mut rec) => {
                if let KindRecord::Snapshot { dataset, .. }
                | KindRecord::Replicate { dataset, .. } = &mut rec.kind
                {
                    *dataset = crate::pools::named_in(pool.name(), dataset);
                }
                let state = states
                    .get(&name)
                    .and_then(|v| decode::<StateRecord>(KIND_STATE, &name, v).ok())
                    .unwrap_or_default();
                out.push((rec, state));
            }
            Err(e) => unreadable.push((name, e)),
        }
    }
    Ok((out, unreadable))
}

/// Stores a schedule (and, for a new scrub schedule, a state that starts
/// counting now); a replication is marked as this daemon's (`node`).
pub fn put(pool: &Pool, s: &Schedule, now: u64, node: &str) -> Result<(), ApiError> {
    let all = stored(pool)?;
    match &s.kind {
        ScheduleKind::Snapshot {
            dataset,
            recursive,
            prefix,
            ..
        } => {
            tarn_dataset::get_props(pool, dataset, &["type".to_string()]).map_err(ds_error)?;
            refuse_shared_snapshots(pool, &s.name, dataset, *recursive, prefix)?;
        }
        ScheduleKind::Replicate {
            dataset,
            token_file,
            env_file,
            ..
        } => {
            tarn_dataset::get_props(pool, dataset, &["type".to_string()]).map_err(ds_error)?;
            if let Some(f) = token_file {
                std::fs::read_to_string(f)
                    .map_err(|e| ApiError::invalid(format!("cannot read {f}: {e}")))?;
            }
            if let Some(f) = env_file {
                read_env_file(f).map_err(ApiError::invalid)?;
            }
        }
        ScheduleKind::Scrub { pause: Some(p), .. } => {
            // Each look pauses or resumes the pool's one scrub by each
            // schedule's hours: two different windows would take turns.
            let clash = all.iter().find_map(|(other, _)| match other.kind {
                KindRecord::Scrub { pause: Some(q), .. } if other.name != s.name && q != *p => {
                    Some((other.name.as_str(), q))
                }
                _ => None,
            });
            if let Some((other, (from, to))) = clash {
                return Err(ApiError::invalid(format!(
                    "scrub schedule '{other}' pauses the scrub of '{}' in hours {from}-{to}: \
                     two pause windows would pause and resume one scrub in turn; give this \
                     one the same --pause, or none",
                    pool.name()
                )));
            }
        }
        ScheduleKind::Scrub { .. } | ScheduleKind::Selftest { .. } => {}
    }
    let mut rec = ScheduleRecord::from(s);
    if let KindRecord::Replicate { node: n, .. } = &mut rec.kind {
        *n = node.to_string();
    }
    let existing = all.into_iter().find(|(r, _)| r.name == s.name);
    tarn_dataset::config_put(pool, KIND_SCHEDULE, &s.name, &encode(&rec)?).map_err(ds_error)?;
    let fresh = existing.is_none_or(|(old, _)| old.kind != rec.kind);
    if fresh {
        let state = StateRecord {
            // Scrubs and self-tests are long and wear the disks: a new
            // schedule waits for its next period. Snapshots and
            // replication run at once, so a mistake shows now.
            last_started_unix: matches!(
                s.kind,
                ScheduleKind::Scrub { .. } | ScheduleKind::Selftest { .. }
            )
            .then_some(now),
            runs: Vec::new(),
        };
        tarn_dataset::config_put(pool, KIND_STATE, &s.name, &encode(&state)?).map_err(ds_error)?;
    }
    Ok(())
}

/// Refuses a snapshot policy whose snapshots another policy of the pool
/// would count as its own: which snapshots a policy prunes is decided by
/// their dataset and name (its prefix), so two policies with one prefix
/// on datasets one of them covers would each destroy what the other's
/// retention keeps (an hourly policy, the other's dailies).
fn refuse_shared_snapshots(
    pool: &Pool,
    name: &str,
    dataset: &str,
    recursive: bool,
    prefix: &str,
) -> Result<(), ApiError> {
    let covers = |a: &str, rec: bool, b: &str| a == b || (rec && b.starts_with(&format!("{a}/")));
    for (other, _) in stored(pool)? {
        if other.name == name {
            continue;
        }
        let Ok(o) = other.to_api(pool.name()) else {
            continue;
        };
        if let ScheduleKind::Snapshot {
            dataset: od,
            recursive: orec,
            prefix: op,
            ..
        } = &o.kind
        {
            if op == prefix && (covers(dataset, recursive, od) || covers(od, *orec, dataset)) {
                return Err(ApiError::invalid(format!(
                    "schedule '{}' takes snapshots named '{prefix}-…' of {} too, and each \
                     policy prunes every such snapshot by its own retention: give this one \
                     another prefix (--prefix)",
                    other.name,
                    if od == dataset { dataset } else { od },
                )));
            }
        }
    }
    Ok(())
}

/// Removes a schedule and its state.
pub fn del(pool: &Pool, name: &str) -> Result<(), ApiError> {
    if !tarn_dataset::config_delete(pool, KIND_SCHEDULE, name).map_err(ds_error)? {
        return Err(ApiError::not_found(format!(
            "no schedule '{name}' in pool '{}'",
            pool.name()
        )));
    }
    let _ = tarn_dataset::config_delete(pool, KIND_STATE, name);
    Ok(())
}

/// The API's list entry of a stored schedule.
pub fn info(pool: &str, rec: &ScheduleRecord, st: &StateRecord, now: u64) -> Option<ScheduleInfo> {
    let schedule = rec.to_api(pool).ok()?;
    let next_due_unix = next_due(&schedule.kind, st.last_started_unix, now);
    Some(ScheduleInfo {
        schedule,
        runs: st
            .runs
            .iter()
            .map(|r| RunRecord {
                started_unix: r.started_unix,
                ok: r.ok,
                detail: r.detail.clone(),
            })
            .collect(),
        next_due_unix,
    })
}

// ---------------------------------------------------------------------
// Running

/// The clock schedules see: the system's, moved by
/// `TARN_TEST_CLOCK_OFFSET` seconds (a test hook: tests of missed
/// periods start the daemon "later" instead of waiting hours).
pub fn clock() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let offset: i64 = std::env::var("TARN_TEST_CLOCK_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    now.saturating_add_signed(offset)
}

/// Runs the schedule `rec` of `pool` now and records the run. The caller
/// holds `Pools::schedule_lock`.
pub fn run(pools: &Pools, pool: &Arc<Pool>, rec: &ScheduleRecord, now: u64) -> RunRec {
    let result = execute(pools, pool, rec, now);
    record(pools, pool, rec, now, result)
}

/// The API's view of a stored schedule, checked as when it was added:
/// records come from the pool's disks, which may come from another
/// machine or a newer tarn. The error says why it cannot run.
fn checked(rec: &ScheduleRecord, pool: &str) -> Result<Schedule, String> {
    let s = rec.to_api(pool)?;
    tarn_api::schedule::check_schedule(&s).map_err(|e| e.to_string())?;
    Ok(s)
}

/// Does what the schedule does; its outcome in a line.
fn execute(
    pools: &Pools,
    pool: &Arc<Pool>,
    rec: &ScheduleRecord,
    now: u64,
) -> Result<String, String> {
    let checked = checked(rec, pool.name());
    if let KindRecord::Replicate { node, .. } = &rec.kind {
        if *node != pools.node_id {
            return Err(format!(
                "this replication schedule was added on another machine (its credential files \
                 are that machine's): add it again here with `tarn schedule add {} replicate …`",
                rec.name
            ));
        }
    }
    match checked {
        Err(e) => Err(e),
        Ok(s) => match &s.kind {
            ScheduleKind::Snapshot {
                dataset,
                recursive,
                keep,
                prefix,
            } => {
                // Checked again at each run: a rename can bring two
                // policies of one prefix onto the same datasets after
                // both were added. Their snapshots are taken, but neither
                // prunes until one gets another prefix.
                let shared = refuse_shared_snapshots(pool, &rec.name, dataset, *recursive, prefix)
                    .err()
                    .map(|e| e.message);
                run_snapshot(pools, dataset, *recursive, keep, prefix, now, shared)
            }
            ScheduleKind::Scrub { .. } => run_scrub(pools, pool),
            ScheduleKind::Selftest { test, .. } => run_selftest(pools, pool.name(), *test),
            ScheduleKind::Replicate { .. } => run_replicate(pools, &s.kind),
        },
    }
}

/// Whether the schedule runs for long (a replication): it runs on a
/// thread of its own, without `Pools::schedule_lock`, so snapshots and
/// scrubs stay on time while it sends.
fn runs_long(rec: &ScheduleRecord) -> bool {
    matches!(rec.kind, KindRecord::Replicate { .. })
}

/// Stores that the schedule started at `now` (before a long run, so the
/// scheduler does not start it again in the same period). The caller
/// holds `Pools::schedule_lock`.
fn mark_started(pool: &Pool, rec: &ScheduleRecord, now: u64) {
    let mut state = stored(pool)
        .ok()
        .and_then(|l| l.into_iter().find(|(r, _)| r.name == rec.name))
        .map(|(_, s)| s)
        .unwrap_or_default();
    state.last_started_unix = Some(now);
    let saved = encode(&state)
        .and_then(|b| tarn_dataset::config_put(pool, KIND_STATE, &rec.name, &b).map_err(ds_error));
    if let Err(e) = saved {
        log::warn!(
            "tarn: cannot record the start of schedule '{}': {e}",
            rec.name
        );
    }
}

/// Long runs in progress, by `POOL/NAME`, taken out when dropped.
struct LongRun<'a> {
    pools: &'a Pools,
    key: String,
}

impl<'a> LongRun<'a> {
    fn start(pools: &'a Pools, pool: &Pool, rec: &ScheduleRecord) -> Option<LongRun<'a>> {
        let key = format!("{}/{}", pool.name(), rec.name);
        let mut running = pools.long_runs.lock().unwrap_or_else(|e| e.into_inner());
        running
            .insert(key.clone())
            .then_some(LongRun { pools, key })
    }
}

impl Drop for LongRun<'_> {
    fn drop(&mut self) {
        self.pools
            .long_runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// `tarn schedule run-now`: runs a schedule and waits for its outcome. A
/// replication runs without `Pools::schedule_lock` (see [`runs_long`]),
/// and not while the scheduler's run of it goes on.
pub fn run_now(
    pools: &Pools,
    pool: &Arc<Pool>,
    rec: &ScheduleRecord,
    now: u64,
) -> Result<RunRec, ApiError> {
    if !runs_long(rec) {
        let _runs = pools
            .schedule_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        return Ok(run(pools, pool, rec, now));
    }
    let Some(_running) = LongRun::start(pools, pool, rec) else {
        return Err(ApiError::busy(format!(
            "schedule '{}' is running now; see `tarn schedule runs {}` when it ends",
            rec.name, rec.name
        )));
    };
    {
        let _runs = pools
            .schedule_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        mark_started(pool, rec, now);
    }
    let result = execute(pools, pool, rec, now);
    let _runs = pools
        .schedule_lock
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Ok(record(pools, pool, rec, now, result))
}

/// Starts a long run on a thread of its own (the scheduler's way); does
/// nothing if it runs already. The caller holds `Pools::schedule_lock`.
fn start_long(pools: &Arc<Pools>, pool: &Arc<Pool>, rec: &ScheduleRecord, now: u64) {
    // Marked as running here, before the thread exists, so a `run-now`
    // in between finds it running; the thread takes the mark over.
    let Some(running) = LongRun::start(pools, pool, rec) else {
        return;
    };
    let key = running.key.clone();
    std::mem::forget(running);
    mark_started(pool, rec, now);
    let name = rec.name.clone();
    let (p, pool, rec) = (pools.clone(), pool.clone(), rec.clone());
    let spawned = std::thread::Builder::new()
        .name("tarn-schedule-run".into())
        .spawn(move || {
            let _running = LongRun {
                pools: &p,
                key: format!("{}/{}", pool.name(), rec.name),
            };
            let result = execute(&p, &pool, &rec, now);
            let _runs = p.schedule_lock.lock().unwrap_or_else(|e| e.into_inner());
            record(&p, &pool, &rec, now, result);
        });
    if let Err(e) = spawned {
        pools
            .long_runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        log::warn!("tarn: cannot start schedule '{name}': {e}");
    }
}

/// `s` cut to `max` characters (the last one an ellipsis).
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// Records the outcome of a run (and raises an event if it failed). The
/// caller holds `Pools::schedule_lock`.
fn record(
    pools: &Pools,
    pool: &Arc<Pool>,
    rec: &ScheduleRecord,
    now: u64,
    result: Result<String, String>,
) -> RunRec {
    let run = match result {
        Ok(detail) => RunRec {
            started_unix: now,
            ok: true,
            detail,
        },
        Err(detail) => RunRec {
            started_unix: now,
            ok: false,
            detail,
        },
    };
    // Every run is in the event log: a failed one as a warning (which
    // alerts deliver by default), a good one for the record.
    if run.ok {
        pools.events.emit(
            tarn_api::events::Severity::Info,
            "schedule.ran",
            Some(pool.name()),
            None,
            format!("schedule '{}' ran: {}", rec.name, cut(&run.detail, 400)),
        );
    } else {
        pools.events.emit(
            tarn_api::events::Severity::Warning,
            "schedule.failed",
            Some(pool.name()),
            None,
            format!("schedule '{}' failed: {}", rec.name, cut(&run.detail, 400)),
        );
    }
    let mut state = stored(pool)
        .ok()
        .and_then(|l| l.into_iter().find(|(r, _)| r.name == rec.name))
        .map(|(_, s)| s)
        .unwrap_or_default();
    state.last_started_unix = Some(now);
    let mut stored_run = run.clone();
    stored_run.detail = cut(&stored_run.detail, MAX_DETAIL);
    state.runs.push(stored_run);
    let excess = state.runs.len().saturating_sub(MAX_RUNS);
    state.runs.drain(..excess);
    // Configuration records hold at most 4 KiB: the oldest runs go first.
    while state.runs.len() > 1 && encode(&state).is_ok_and(|b| b.len() > 4000) {
        state.runs.remove(0);
    }
    match encode(&state) {
        Ok(bytes) => {
            if let Err(e) = tarn_dataset::config_put(pool, KIND_STATE, &rec.name, &bytes) {
                log::warn!(
                    "tarn: cannot record the run of schedule '{}': {e}",
                    rec.name
                );
            }
        }
        Err(e) => log::warn!(
            "tarn: cannot record the run of schedule '{}': {e}",
            rec.name
        ),
    }
    run
}

fn run_snapshot(
    pools: &Pools,
    dataset: &str,
    recursive: bool,
    keep: &Retention,
    prefix: &str,
    now: u64,
    shared: Option<String>,
) -> Result<String, String> {
    let name = snapshot_name(prefix, now);
    let full = format!("{dataset}@{name}");
    // What the replication port receives into (a token's dataset and what
    // is below it) is the sender's to snapshot and prune: the port never
    // rolls back, so a snapshot taken here would make it refuse the next
    // incremental, and pruning here would take the sender's snapshots.
    let targets: Vec<String> = pools
        .tokens
        .list()
        .map_err(|e| format!("cannot read the replication tokens: {e}"))?
        .into_iter()
        .map(|t| t.dataset)
        .collect();
    let received_by = |d: &str| {
        targets
            .iter()
            .find(|t| d == t.as_str() || d.starts_with(&format!("{t}/")))
    };
    let under = |d: &str| d == dataset || (recursive && d.starts_with(&format!("{dataset}/")));
    let covered = |d: &str| under(d) && received_by(d).is_none();
    if let Some(t) = received_by(dataset) {
        return Err(format!(
            "{dataset} receives replication (token for {t}): its snapshots come from the \
             sender, and one taken here would stop the next incremental; nothing taken"
        ));
    }
    // The datasets are listed only when a target lies under the policy.
    let datasets = if targets.iter().any(|t| under(t)) {
        pools.dataset_list(false).map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    let skipped: Vec<&str> = datasets
        .iter()
        .map(|d| d.name.as_str())
        .filter(|d| under(d) && !covered(d))
        .collect();
    let result = if skipped.is_empty() {
        pools.dataset_snapshot(std::slice::from_ref(&full), recursive)
    } else {
        // One snapshot of each covered dataset, at once, as the
        // recursive snapshot would have been.
        let each: Vec<String> = datasets
            .iter()
            .filter(|d| covered(&d.name))
            .map(|d| format!("{}@{name}", d.name))
            .collect();
        pools.dataset_snapshot(&each, false)
    };
    let skipped_note = if skipped.is_empty() {
        String::new()
    } else {
        format!(", not of {} (receiving replication)", skipped.join(", "))
    };
    let taken = match result {
        Ok(()) => format!(
            "took {full}{}{skipped_note}",
            if recursive { " (recursive)" } else { "" }
        ),
        Err(e) if e.code == tarn_api::ErrorCode::Exists => {
            // Run twice within a minute (by hand): the snapshot exists, of
            // every dataset the policy covers. A recursive snapshot is
            // refused whole when one dataset below has the name already
            // (taken by hand): then nothing was taken, which must show.
            let have: BTreeSet<String> = pools
                .dataset_list(true)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|d| d.name)
                .collect();
            let missing: Vec<String> = pools
                .dataset_list(false)
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|d| covered(&d.name) && !have.contains(&format!("{}@{name}", d.name)))
                .map(|d| d.name)
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "cannot take {full}: {e} (so none was taken of {})",
                    missing.join(", ")
                ));
            }
            format!("{full} exists already")
        }
        Err(e) => return Err(format!("cannot take {full}: {e}")),
    };
    if let Some(why) = shared {
        return Err(format!("{taken}; pruned nothing: {why}"));
    }
    let all = pools.dataset_list(true).map_err(|e| e.to_string())?;
    let mut per_dataset: BTreeMap<String, Vec<Snap>> = BTreeMap::new();
    for d in &all {
        let Some((fs, short)) = d.name.split_once('@') else {
            continue;
        };
        if covered(fs) && is_policy_snapshot(short, prefix) {
            per_dataset.entry(fs.to_string()).or_default().push(Snap {
                name: d.name.clone(),
                creation: d.creation_unix,
                txg: d.createtxg,
            });
        }
    }
    let origins: BTreeSet<String> = all.iter().filter_map(|d| d.origin.clone()).collect();
    let mut destroyed = 0usize;
    let mut failures = Vec::new();
    for snaps in per_dataset.values() {
        let names: Vec<String> = snaps.iter().map(|s| s.name.clone()).collect();
        let held: BTreeSet<String> = pools
            .dataset_holds(&names, false)
            .map_err(|e| format!("cannot read the holds: {e}"))?
            .into_iter()
            .map(|h| h.snapshot)
            .collect();
        for victim in prune(keep, snaps, |n| held.contains(n) || origins.contains(n)) {
            match pools.dataset_destroy(&victim, false) {
                Ok(()) => destroyed += 1,
                Err(e) => failures.push(format!("{victim}: {e}")),
            }
        }
    }
    if failures.is_empty() {
        Ok(format!("{taken}; pruned {destroyed}"))
    } else {
        Err(format!(
            "{taken}; pruned {destroyed}; could not destroy {}",
            failures.join("; ")
        ))
    }
}

fn run_scrub(pools: &Pools, pool: &Pool) -> Result<String, String> {
    use tarn_api::pool::{ScanKind, ScanState};
    let name = pool.name();
    let scan = pools
        .pool_status(Some(name))
        .map_err(|e| format!("cannot read the state of '{name}': {e}"))?
        .first()
        .and_then(|s| s.scan.clone());
    if let Some(scan) = scan.filter(|s| s.kind == ScanKind::Scrub) {
        match scan.state {
            // A scrub that takes longer than the period is not a failure
            // (nor an alert each period).
            ScanState::Scanning => {
                return Ok(format!(
                    "the scrub of '{name}' started at {} is still running",
                    iso_minute(scan.started_unix)
                ))
            }
            // Starting would resume it.
            ScanState::Paused if paused_by_schedule(pool) != Some(scan.started_unix) => {
                return Ok(format!(
                    "the scrub of '{name}' paused by hand stays paused (`tarn pool scrub \
                     --resume {name}` resumes it)"
                ))
            }
            _ => {}
        }
    }
    match pools.pool_scrub(name, tarn_api::pool::ScrubAction::Start) {
        Ok(_) => Ok(format!("started a scrub of '{name}'")),
        Err(e) => Err(format!("cannot start a scrub of '{name}': {e}")),
    }
}

/// The start of the scrub a schedule paused in its pause hours, as the
/// [`KIND_PAUSED`] record of `pool` names it; none: no such scrub.
fn paused_by_schedule(pool: &Pool) -> Option<u64> {
    tarn_dataset::config_list(pool, KIND_PAUSED)
        .ok()
        .and_then(|l| l.into_iter().find(|(n, _)| n == PAUSED_NAME))
        .and_then(|(_, v)| serde_json::from_slice(&v).ok())
}

/// Starts a self-test on every disk of the pool; file devices are
/// skipped (they have none). Results arrive later, through the health
/// watch, which raises an event for a failed one.
fn run_selftest(pools: &Pools, pool: &str, test: SelfTest) -> Result<String, String> {
    let status = pools.pool_status(Some(pool)).map_err(|e| e.to_string())?;
    let leaves: Vec<String> = status
        .iter()
        .flat_map(|s| crate::health::leaves(&s.vdevs))
        .collect();
    let disks: Vec<&String> = leaves
        .iter()
        .filter(|d| crate::health::is_block_device(d))
        .collect();
    if disks.is_empty() {
        return Ok(format!(
            "'{pool}' has no disks to test ({} file devices have no self-test)",
            leaves.len()
        ));
    }
    let mut started = Vec::new();
    let mut failed = Vec::new();
    for d in disks {
        match crate::health::self_test(d, test.name()) {
            Ok(_) => started.push(d.as_str()),
            Err(e) => failed.push(format!("{d}: {e}")),
        }
    }
    let done = format!(
        "started a {} self-test on {}",
        test.name(),
        if started.is_empty() {
            "no disk".to_string()
        } else {
            started.join(", ")
        }
    );
    if failed.is_empty() {
        Ok(done)
    } else {
        Err(format!("{done}; {}", failed.join("; ")))
    }
}

/// Names a credentials file may set: what `tarn replicate` reads to reach
/// an object store, and nothing else (a file cannot set `LD_PRELOAD`).
const ENV_NAMES: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "TARN_S3_ENDPOINT",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "TARN_S3_PATH_STYLE",
    "SSL_CERT_FILE",
];

/// Reads a credentials file: `NAME=VALUE` lines (an `export ` before the
/// name and quotes around the value are allowed, `#` starts a comment),
/// names from [`ENV_NAMES`], readable by its owner only.
pub fn read_env_file(path: &str) -> Result<Vec<(String, String)>, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    // Opened once, not through a symbolic link, and checked on what was
    // opened: owned by the daemon's user, readable by it alone (another
    // user who could write it could point root's replication elsewhere).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot read {path}: {e} (a symbolic link is not followed)"))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me {
        return Err(format!(
            "{path} must be a file owned by the daemon's user (uid {me})"
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{path} holds credentials but others may read it: chmod 600 {path}"
        ));
    }
    let mut text = String::new();
    f.take(64 << 10)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("{path}:{}: expected NAME=VALUE", i + 1));
        };
        let name = name.trim();
        if !ENV_NAMES.contains(&name) {
            return Err(format!(
                "{path}:{}: '{name}' is not one of {}",
                i + 1,
                ENV_NAMES.join(", ")
            ));
        }
        let value = value.trim();
        let unquoted = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        out.push((name.to_string(), unquoted.to_string()));
    }
    Ok(out)
}

/// The newest snapshot of `dataset` (by the txg that took it) named as a
/// snapshot policy with `prefix` names them ([`is_policy_snapshot`]: not
/// another policy's whose prefix starts with this one), or of any name.
fn newest_snapshot<'a>(
    all: impl IntoIterator<Item = (&'a str, u64)>,
    dataset: &str,
    prefix: Option<&str>,
) -> Option<String> {
    all.into_iter()
        .filter(|(name, _)| {
            name.split_once('@').is_some_and(|(fs, short)| {
                fs == dataset && prefix.is_none_or(|p| is_policy_snapshot(short, p))
            })
        })
        .max_by_key(|(_, txg)| *txg)
        .map(|(name, _)| name.to_string())
}

/// How long a scheduled replication may run before it is stopped and
/// recorded as failed: 24 hours (`TARN_REPLICATE_LIMIT_SECS` for tests).
/// A first copy bigger than a day's transfer goes by hand, with `tarn
/// replicate`, which resumes.
fn replicate_limit() -> Duration {
    Duration::from_secs(
        std::env::var("TARN_REPLICATE_LIMIT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(24 * 3600),
    )
}

/// Runs `cmd` with its output captured (the first MiB of each), killed
/// after `limit`.
fn run_bounded(
    mut cmd: std::process::Command,
    limit: Duration,
) -> Result<std::process::Output, String> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run tarn replicate: {e}"))?;
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.by_ref().take(1 << 20).read_to_end(&mut v);
                // Keep reading (and dropping) so the child never blocks.
                let _ = std::io::copy(&mut r, &mut std::io::sink());
            }
            v
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "stopped after {} s without finishing (run `tarn replicate` by hand for a \
                     first copy that big: it resumes)",
                    limit.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for tarn replicate: {e}")),
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// Sends the newest snapshot by running `tarn replicate` against this
/// daemon's admin socket, as the owner would from cron: the code that
/// replicates by hand is the code that replicates on schedule, and a
/// store or a remote tarn that hangs or misbehaves affects a child
/// process, not the daemon. The command holds the snapshot it sent, so
/// pruning keeps the base of the next incremental.
fn run_replicate(pools: &Pools, kind: &ScheduleKind) -> Result<String, String> {
    let ScheduleKind::Replicate {
        dataset,
        to,
        prefix,
        token_file,
        fingerprint,
        env_file,
        ..
    } = kind
    else {
        return Err("not a replication schedule".into());
    };
    let socket = pools
        .admin_socket
        .get()
        .ok_or("this daemon has no admin socket to replicate through")?;
    let all = pools.dataset_list(true).map_err(|e| e.to_string())?;
    let named = all.iter().map(|d| (d.name.as_str(), d.createtxg));
    let Some(snap) = newest_snapshot(named, dataset, prefix.as_deref()) else {
        return Err(match prefix {
            Some(p) => format!("{dataset} has no snapshot named {p}-… to send"),
            None => format!("{dataset} has no snapshot to send"),
        });
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find tarn itself: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--socket")
        .arg(socket)
        .arg("replicate")
        .arg(&snap)
        .arg("--to")
        .arg(to)
        .stdin(std::process::Stdio::null());
    if let Some(f) = token_file {
        cmd.arg("--token-file").arg(f);
    }
    if let Some(f) = fingerprint {
        cmd.arg("--fingerprint").arg(f);
    }
    // Only the schedule's own settings reach the store: none of the
    // daemon's, nor its systemd socket.
    for name in ENV_NAMES.iter().chain(&["NOTIFY_SOCKET", "TARN_SOCKET"]) {
        cmd.env_remove(name);
    }
    if let Some(f) = env_file {
        for (k, v) in read_env_file(f)? {
            cmd.env(k, v);
        }
    }
    let out = run_bounded(cmd, replicate_limit())?;
    let lines = |b: &[u8]| -> String {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
    };
    if out.status.success() {
        Ok(lines(&out.stdout))
    } else {
        let why = lines(&out.stderr);
        Err(format!(
            "replicating {snap} to {to} failed: {}",
            why.strip_prefix("tarn: error: ").unwrap_or(&why)
        ))
    }
}

/// Config kind of the record that says a schedule paused the pool's
/// scrub (name [`PAUSED_NAME`]; value: that scrub's start, Unix seconds),
/// present from the pause to the resume.
pub const KIND_PAUSED: &str = "schedpause";

/// The name of the [`KIND_PAUSED`] record.
const PAUSED_NAME: &str = "scrub";

/// Pauses the scrub of `pool` in the pause hours of its scrub schedules,
/// and resumes it after them: only the very scrub a schedule paused (a
/// record in the pool names it by its start, across restarts and
/// schedule changes), never one paused by hand, which stays paused until
/// resumed by hand.
fn apply_pause(pools: &Pools, pool: &Pool, pause: Option<(u8, u8)>, now: u64) {
    use tarn_api::pool::{ScanKind, ScanState, ScrubAction};
    let name = pool.name();
    let Ok(status) = pools.pool_status(Some(name)) else {
        return;
    };
    let scan = status.first().and_then(|s| s.scan.clone());
    let paused_by_schedule = paused_by_schedule(pool);
    let record = |started: Option<u64>| {
        let r = match started {
            Some(t) => {
                tarn_dataset::config_put(pool, KIND_PAUSED, PAUSED_NAME, t.to_string().as_bytes())
            }
            None => tarn_dataset::config_delete(pool, KIND_PAUSED, PAUSED_NAME).map(|_| ()),
        };
        if let Err(e) = r {
            log::warn!("tarn: scrub schedule of '{name}': cannot record its pause: {e}");
        }
    };
    let Some(scan) = scan.filter(|s| s.kind == ScanKind::Scrub) else {
        if paused_by_schedule.is_some() {
            record(None);
        }
        return;
    };
    let ours = paused_by_schedule == Some(scan.started_unix);
    // Resumed by hand, ended, or another scrub since: the record is done.
    if paused_by_schedule.is_some() && !(ours && scan.state == ScanState::Paused) {
        record(None);
    }
    let action = match (scan.state, paused_at(pause, now)) {
        (ScanState::Scanning, true) => ScrubAction::Pause,
        (ScanState::Paused, false) if ours => ScrubAction::Resume,
        _ => return,
    };
    match pools.pool_scrub(name, action) {
        Ok(_) if action == ScrubAction::Pause => record(Some(scan.started_unix)),
        Ok(_) => record(None),
        Err(e) => {
            log::warn!("tarn: scrub schedule of '{name}': cannot {action:?} the scrub: {e}")
        }
    }
}

/// One look at every schedule: runs what is due, applies pause hours;
/// then at every pool, for events.
pub fn tick(pools: &Arc<Pools>, now: u64) {
    look_at_schedules(pools, now);
    pools.events.observe(pools);
    pools.watch_health();
}

fn look_at_schedules(pools: &Arc<Pools>, now: u64) {
    let _runs = pools
        .schedule_lock
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    for pool in pools.all_pools() {
        look_at_pool(pools, &pool, now);
    }
}

/// [`look_at_schedules`] for one pool (the caller holds
/// `Pools::schedule_lock`).
fn look_at_pool(pools: &Arc<Pools>, pool: &Arc<Pool>, now: u64) {
    let Ok((mut list, unreadable)) = stored_all(pool) else {
        return;
    };
    for (name, why) in unreadable {
        not_run(pools, pool.name(), &name, &why);
    }
    // Snapshots first: a replication due in the same look sends the
    // snapshot just taken.
    list.sort_by_key(|(r, _)| !matches!(r.kind, KindRecord::Snapshot { .. }));
    for (rec, state) in list {
        // A record this tarn cannot read, or would not have stored:
        // `execute` refuses it too, with the reason, when run by hand.
        let s = match checked(&rec, pool.name()) {
            Ok(s) => s,
            Err(why) => {
                not_run(pools, pool.name(), &rec.name, &why);
                continue;
            }
        };
        if due(&s.kind, state.last_started_unix, now) {
            if runs_long(&rec) {
                start_long(pools, pool, &rec, now);
            } else {
                run(pools, pool, &rec, now);
            }
        }
        if let ScheduleKind::Scrub { pause: Some(p), .. } = s.kind {
            apply_pause(pools, pool, Some(p), now);
        }
    }
}

/// Tells the owner, once per daemon run and reason, that a stored
/// schedule does not run because this tarn cannot read it (a newer tarn
/// wrote it, or the pool came from elsewhere): a warning event, which the
/// alerts deliver. A policy that stops taking snapshots must not stop
/// without a word.
fn not_run(pools: &Pools, pool: &str, name: &str, why: &str) {
    let told = pools
        .schedules_not_run
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(format!("{pool}\0{name}\0{why}"));
    if told {
        pools.events.emit(
            tarn_api::events::Severity::Warning,
            "schedule.unreadable",
            Some(pool),
            None,
            format!(
                "schedule '{name}' does not run: this tarn cannot read it ({}); a newer \
                 tarn may have written it. Run that version, or remove it with `tarn \
                 schedule del {name} --pool {pool}` and add it again",
                cut(why, 300)
            ),
        );
    }
}

/// Starts the thread that looks at the schedules every
/// `TARN_SCHEDULE_TICK_MS` milliseconds (30 s by default).
pub fn start_scheduler(pools: Weak<Pools>) -> std::io::Result<crate::periodic::Periodic> {
    let every = crate::periodic::tick_from_env("TARN_SCHEDULE_TICK_MS", Duration::from_secs(30));
    crate::periodic::Periodic::start("tarn-schedules", every, pools, |p| tick(p, clock()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_767_225_600; // 2026-01-01 00:00 UTC, a Thursday

    #[test]
    fn periods_start_where_the_calendar_says() {
        let t = T0 + 40 * DAY + 13 * 3600 + 125; // 2026-02-10 13:02:05, a Tuesday
        assert_eq!(snapshot_name("auto", t), "auto-2026-02-10-1302");
        assert_eq!(bucket(Period::Hour, t), t - 125);
        assert_eq!(bucket(Period::Day, t), T0 + 40 * DAY);
        assert_eq!(bucket(Period::Week, t), T0 + 39 * DAY, "Monday 9 February");
        assert_eq!(bucket(Period::Month, t), T0 + 31 * DAY);
        assert_eq!(bucket(Period::Year, t), T0);
        assert_eq!(
            next_bucket(Period::Month, T0 + 31 * DAY),
            T0 + 59 * DAY,
            "1 March"
        );
        assert_eq!(next_bucket(Period::Year, T0), T0 + 365 * DAY);
        assert_eq!(snapshot_name("a", 0), "a-1970-01-01-0000");
    }

    const PERIODS: [Period; 5] = [
        Period::Hour,
        Period::Day,
        Period::Week,
        Period::Month,
        Period::Year,
    ];

    /// Period `p` holds its own start, starts no later than `t`, and the
    /// next one starts after `t` with nothing between the two.
    fn check_bucket(p: Period, t: u64) {
        let b = bucket(p, t);
        assert!(b <= t, "{p:?} of {t} starts at {b}");
        assert_eq!(bucket(p, b), b, "{p:?} of {t}");
        let n = next_bucket(p, t);
        assert!(n > t, "{p:?} after {t} starts at {n}");
        assert_eq!(bucket(p, n), n, "{p:?} after {t}");
        assert_eq!(
            bucket(p, n - 1),
            b,
            "{p:?} of {t}: nothing between two periods"
        );
    }

    proptest! {
        #[test]
        fn buckets_are_consistent(t in 0u64..4_102_444_800, p in 0usize..5) {
            check_bucket(PERIODS[p], t);
        }
    }

    /// A policy takes its own names and no others: not another policy's
    /// whose prefix starts with its own, nor a name by hand.
    #[test]
    fn policies_know_their_own_snapshots() {
        for t in (0..4_102_444_800u64).step_by(7_777_777) {
            assert!(is_policy_snapshot(&snapshot_name("auto", t), "auto"));
            assert!(is_policy_snapshot(
                &snapshot_name("auto-daily", t),
                "auto-daily"
            ));
            assert!(!is_policy_snapshot(&snapshot_name("auto-daily", t), "auto"));
            assert!(!is_policy_snapshot(&snapshot_name("auto", t), "auto-daily"));
            assert!(!is_policy_snapshot(&snapshot_name("autox", t), "auto"));
        }
        for hand in [
            "auto",
            "auto-",
            "auto-manual",
            "auto-2026-11-30-12000",
            "auto-2026-11-30-120",
            "auto-2026-11-30T1200",
            "auto-2026-1a-30-1200",
        ] {
            assert!(!is_policy_snapshot(hand, "auto"), "{hand}");
        }
    }

    /// The first days after the epoch, a clock not yet set: the week that
    /// holds them began before 1970 and must not wrap around (it counts
    /// from the epoch, and the next starts on Monday 1970-01-05).
    #[test]
    fn periods_right_after_the_epoch() {
        for t in (0..10 * DAY).step_by(1800) {
            for p in PERIODS {
                check_bucket(p, t);
            }
        }
        assert_eq!(bucket(Period::Week, 3 * DAY + 5), 0);
        assert_eq!(next_bucket(Period::Week, 0), 4 * DAY);
        assert_eq!(bucket(Period::Week, 4 * DAY), 4 * DAY);
    }

    fn keep(h: u32, d: u32, w: u32, m: u32, y: u32) -> Retention {
        Retention {
            hourly: h,
            daily: d,
            weekly: w,
            monthly: m,
            yearly: y,
        }
    }

    fn policy(k: Retention) -> ScheduleKind {
        ScheduleKind::Snapshot {
            dataset: "tank/a".into(),
            recursive: false,
            keep: k,
            prefix: "auto".into(),
        }
    }

    /// Records this build cannot read (a kind it does not know, a period
    /// it does not know) do not run, and the owner is told once per
    /// record and reason, not on every look; a readable one beside them
    /// still runs.
    #[test]
    fn schedules_this_tarn_cannot_read_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let pools = Arc::new(Pools::open(&state, &crate::pools::Tuning::default()).unwrap());
        let pool = tarn_testkit::pools::tank(dir.path(), tarn_vdev::VdevKind::Mirror, 2, 64 << 20);
        let put = |name: &str, json: &str| {
            tarn_dataset::config_put(&pool, KIND_SCHEDULE, name, json.as_bytes()).unwrap();
        };
        put(
            "future",
            r#"{"name":"future","kind":{"defrag":{"every":"daily"}}}"#,
        );
        put(
            "yearly",
            r#"{"name":"yearly","kind":{"scrub":{"every":"yearly","at_hour":2,"pause":null}}}"#,
        );
        put(
            "monthly",
            r#"{"name":"monthly","kind":{"scrub":{"every":"monthly","at_hour":0,"pause":null}}}"#,
        );
        let unreadable = |p: &Pools| -> Vec<String> {
            p.events
                .list(None, 1000)
                .into_iter()
                .filter(|e| e.kind == "schedule.unreadable")
                .map(|e| e.message)
                .collect()
        };
        let ran = |p: &Pools| {
            p.events
                .list(None, 1000)
                .iter()
                .filter(|e| e.kind == "schedule.ran" || e.kind == "schedule.failed")
                .count()
        };
        let now = T0 + 40 * DAY + 5 * 3600;
        look_at_pool(&pools, &pool, now);
        let told = unreadable(&pools);
        assert_eq!(told.len(), 2, "{told:?}");
        assert!(told.iter().any(|m| m.contains("'future'")), "{told:?}");
        assert!(
            told.iter()
                .any(|m| m.contains("'yearly'") && m.contains("unknown period")),
            "{told:?}"
        );
        assert_eq!(ran(&pools), 1, "the monthly scrub was due and was run");
        look_at_pool(&pools, &pool, now + 60);
        assert_eq!(unreadable(&pools).len(), 2, "told again on the next look");
    }

    /// After the clock ran two days ahead and was set back, the snapshot
    /// just taken (the newest by txg, dated before the others) is kept:
    /// it is the next incremental's base.
    #[test]
    fn the_newest_snapshot_is_the_last_taken_whatever_its_date() {
        let ahead = T0 + 70 * 365 * DAY;
        let mut snaps: Vec<Snap> = (0..48u64)
            .map(|i| Snap {
                name: snapshot_name("auto", ahead + i * 3600),
                creation: ahead + i * 3600,
                txg: i + 1,
            })
            .collect();
        snaps.push(Snap {
            name: snapshot_name("auto", T0),
            creation: T0,
            txg: 49,
        });
        let gone = prune(&keep(24, 0, 0, 0, 0), &snaps, |_| false);
        assert!(!gone.contains(&snapshot_name("auto", T0)), "{gone:?}");
        assert_eq!(gone.len(), 24, "{gone:?}");
    }

    /// A year of an hourly policy, the scheduler looking every 10 minutes:
    /// one snapshot per hour is taken, and after every run what is left is
    /// exactly what the policy says: per period kind, the first snapshot of
    /// each of its most recent periods, and nothing else.
    #[test]
    fn a_year_of_hourly_snapshots_keeps_exactly_the_counts() {
        let k = keep(24, 30, 8, 12, 0);
        let kind = policy(k);
        let mut snaps: Vec<Snap> = Vec::new();
        let mut last = None;
        let mut taken = 0;
        let mut all_taken: Vec<u64> = Vec::new();
        let mut t = T0 + 1234;
        let end = T0 + 365 * DAY;
        while t < end {
            if due(&kind, last, t) {
                last = Some(t);
                taken += 1;
                all_taken.push(t);
                snaps.push(Snap {
                    name: snapshot_name("auto", t),
                    creation: t,
                    txg: taken,
                });
                let gone = prune(&k, &snaps, |_| false);
                snaps.retain(|s| !gone.contains(&s.name));
            }
            t += 600;
        }
        assert_eq!(taken, 365 * 24, "one snapshot per hour, no more, no less");
        // Per kind: the first snapshot taken in each of the most recent
        // periods is there.
        for (p, n) in periods(&k) {
            if n == 0 {
                continue;
            }
            let mut firsts: BTreeMap<u64, u64> = BTreeMap::new();
            for &x in &all_taken {
                firsts.entry(bucket(p, x)).or_insert(x);
            }
            for (_, first) in firsts.iter().rev().take(n as usize) {
                let name = snapshot_name("auto", *first);
                assert!(
                    snaps.iter().any(|s| s.name == name),
                    "{p:?}: {name} was pruned"
                );
            }
        }
        // Nothing else: every snapshot left is one of those (or the newest).
        let must = kept(&k, &snaps);
        assert_eq!(snaps.len(), must.len());
        // The counts, by hand: 24 hours; 30 days (today's first is among
        // the hours); 8 weeks; 12 months, overlapping.
        let hours = snaps
            .iter()
            .filter(|s| s.creation + 24 * 3600 > end)
            .count();
        assert_eq!(hours, 24);
        let months: BTreeSet<u64> = snaps
            .iter()
            .map(|s| bucket(Period::Month, s.creation))
            .collect();
        assert_eq!(months.len(), 12);
        assert!(
            snaps.len() < 24 + 30 + 8 + 12,
            "the kinds overlap: {}",
            snaps.len()
        );
    }

    #[test]
    fn a_missed_period_runs_once_after_downtime() {
        let kind = policy(keep(24, 0, 0, 0, 0));
        let last = T0 + 5 * 3600 + 10;
        assert!(!due(&kind, Some(last), last + 60), "same hour");
        // Down for three hours and a half: due once, and once it ran, not
        // again in that hour.
        let back = last + 3 * 3600 + 1800;
        assert!(due(&kind, Some(last), back));
        assert!(!due(&kind, Some(back), back + 600));
        assert_eq!(
            next_due(&kind, Some(back), back + 600),
            Some(bucket(Period::Hour, back) + 3600)
        );
        let scrub = ScheduleKind::Scrub {
            every: Every::Monthly,
            at_hour: 2,
            pause: None,
        };
        let added = T0 + 3 * DAY;
        assert!(
            !due(&scrub, Some(added), added + 3600),
            "not in the month it was added"
        );
        let next_month = T0 + 31 * DAY;
        assert!(
            !due(&scrub, Some(added), next_month + 3600),
            "not before 02:00"
        );
        assert!(due(&scrub, Some(added), next_month + 2 * 3600));
        assert_eq!(
            next_due(&scrub, Some(added), added),
            Some(next_month + 2 * 3600)
        );
        // Down all of March: one scrub in April.
        let april = T0 + 90 * DAY + 5 * 3600;
        assert!(due(&scrub, Some(next_month + 2 * 3600), april));
        // A clock once far ahead (a board before its time was set), then
        // set right: due now, not idle until 2096; once run, not again.
        let ahead = 4_000_000_000;
        for k in [&kind, &scrub] {
            assert!(due(k, Some(ahead), april), "{k:?}");
            assert!(!due(k, Some(april), april + 60), "{k:?}");
            // A step back of seconds across the start of a period (time
            // synchronisation) is no new period: no second run.
            let start = bucket(Period::Hour, april) + 3600;
            assert!(!due(k, Some(start + 1), start - 5), "{k:?}");
        }
        // A clock three hours ahead at boot (kept in local time), then set
        // right: hourly snapshots go on at once; a monthly scrub that ran
        // waits (it is no new month), as does an hourly policy after a step
        // back of half an hour.
        assert!(due(&kind, Some(april + 3 * 3600), april));
        assert!(!due(&kind, Some(april + 1800), april));
        assert!(!due(&scrub, Some(april + 3 * 3600), april));
    }

    #[test]
    fn held_cloned_and_newest_snapshots_survive_pruning() {
        let k = keep(2, 0, 0, 0, 0);
        let snaps: Vec<Snap> = (0..6)
            .map(|i| Snap {
                name: format!("tank/a@auto-{i}"),
                creation: T0 + i * 3600,
                txg: i,
            })
            .collect();
        let gone = prune(&k, &snaps, |n| n.ends_with("-1") || n.ends_with("-2"));
        assert_eq!(gone, ["tank/a@auto-0", "tank/a@auto-3"]);
        // Keeping only yearly: the newest is never pruned (an incremental
        // send's base), nor the first of the year.
        let gone = prune(&keep(0, 0, 0, 0, 1), &snaps, |_| false);
        assert_eq!(
            gone,
            [
                "tank/a@auto-1",
                "tank/a@auto-2",
                "tank/a@auto-3",
                "tank/a@auto-4"
            ]
        );
    }

    #[test]
    fn pause_hours_wrap_past_midnight() {
        let at = |h: u64| T0 + h * 3600 + 59;
        assert!(paused_at(Some((8, 23)), at(8)));
        assert!(!paused_at(Some((8, 23)), at(23)));
        assert!(!paused_at(Some((8, 23)), at(7)));
        assert!(paused_at(Some((22, 6)), at(23)));
        assert!(paused_at(Some((22, 6)), at(5)));
        assert!(!paused_at(Some((22, 6)), at(6)));
        assert!(!paused_at(None, at(12)));
    }

    /// The stored JSON, pinned (docs/format.md).
    #[test]
    fn schedule_records_golden() {
        let s = Schedule {
            name: "photos".into(),
            pool: "tank".into(),
            kind: policy(keep(24, 30, 8, 12, 0)),
        };
        let rec = ScheduleRecord::from(&s);
        let golden = r#"{"name":"photos","kind":{"snapshot":{"dataset":"tank/a","recursive":false,"keep":[24,30,8,12,0],"prefix":"auto"}}}"#;
        assert_eq!(serde_json::to_string(&rec).unwrap(), golden);
        assert_eq!(serde_json::from_str::<ScheduleRecord>(golden).unwrap(), rec);
        assert_eq!(rec.to_api("tank").unwrap(), s);
        let scrub =
            r#"{"name":"monthly","kind":{"scrub":{"every":"monthly","at_hour":2,"pause":[8,23]}}}"#;
        let rec: ScheduleRecord = serde_json::from_str(scrub).unwrap();
        assert_eq!(serde_json::to_string(&rec).unwrap(), scrub);
        let state =
            r#"{"last_started_unix":5,"runs":[{"started_unix":5,"ok":true,"detail":"took x"}]}"#;
        let st: StateRecord = serde_json::from_str(state).unwrap();
        assert_eq!(serde_json::to_string(&st).unwrap(), state);
        let bad = r#"{"name":"m","kind":{"scrub":{"every":"yearly","at_hour":2,"pause":null}}}"#;
        let rec: ScheduleRecord = serde_json::from_str(bad).unwrap();
        assert!(rec.to_api("tank").is_err(), "an unknown period is not run");
        let selftest =
            r#"{"name":"t","kind":{"selftest":{"test":"long","every":"weekly","at_hour":3}}}"#;
        let rec: ScheduleRecord = serde_json::from_str(selftest).unwrap();
        assert_eq!(serde_json::to_string(&rec).unwrap(), selftest);
        assert_eq!(
            ScheduleRecord::from(&rec.to_api("tank").unwrap()),
            rec,
            "round trip"
        );
        let bad = selftest.replace("long", "medium");
        let rec: ScheduleRecord = serde_json::from_str(&bad).unwrap();
        assert!(rec.to_api("tank").is_err(), "an unknown test is not run");
        let repl = r#"{"name":"off","kind":{"replicate":{"dataset":"tank/a","to":"s3://b/p","prefix":"auto","every":"hourly","at_hour":0,"token_file":null,"fingerprint":null,"env_file":"/etc/tarn/s3.env","node":"ab12"}}}"#;
        let rec: ScheduleRecord = serde_json::from_str(repl).unwrap();
        assert_eq!(serde_json::to_string(&rec).unwrap(), repl);
        let mut back = ScheduleRecord::from(&rec.to_api("tank").unwrap());
        if let KindRecord::Replicate { node, .. } = &mut back.kind {
            assert_eq!(node, "", "the API does not carry the node; put() sets it");
            *node = "ab12".into();
        }
        assert_eq!(back, rec);
    }

    #[test]
    fn replication_sends_the_newest_snapshot_of_its_prefix() {
        let all = [
            ("tank/a", 0),
            ("tank/a@auto-2026-01-01-0000", 5),
            ("tank/a@manual", 9),
            ("tank/a@auto-2026-01-01-0100", 7),
            ("tank/a@autumn", 11),
            ("tank/a@auto-daily-2026-01-02-0000", 10),
            ("tank/ab@auto-2026-01-02-0000", 12),
            ("tank/a/b@auto-2026-01-02-0000", 13),
        ];
        assert_eq!(
            newest_snapshot(all, "tank/a", Some("auto")).as_deref(),
            Some("tank/a@auto-2026-01-01-0100"),
            "by txg, not by name; 'autumn' is not an auto- snapshot, nor \
             'auto-daily-…' (another policy's)"
        );
        assert_eq!(
            newest_snapshot(all, "tank/a", Some("auto-daily")).as_deref(),
            Some("tank/a@auto-daily-2026-01-02-0000")
        );
        assert_eq!(
            newest_snapshot(all, "tank/a", None).as_deref(),
            Some("tank/a@autumn")
        );
        assert_eq!(newest_snapshot(all, "tank/c", None), None);
    }

    #[test]
    fn credentials_files_are_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s3.env");
        let path = f.to_str().unwrap();
        std::fs::write(
            &f,
            "# the offsite store\nexport AWS_ACCESS_KEY_ID=ak\nAWS_SECRET_ACCESS_KEY=\"s k\"\n\n\
             TARN_S3_ENDPOINT='http://127.0.0.1:9000'\n",
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let vars = read_env_file(path).unwrap();
        assert_eq!(
            vars,
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "ak".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "s k".to_string()),
                (
                    "TARN_S3_ENDPOINT".to_string(),
                    "http://127.0.0.1:9000".to_string()
                ),
            ]
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_env_file(path).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&f, "AWS_REGION=x\nLD_PRELOAD=/tmp/evil.so\n").unwrap();
        let e = read_env_file(path).unwrap_err();
        assert!(e.contains(":2:") && e.contains("LD_PRELOAD"), "{e}");
        std::fs::write(&f, "AWS_REGION\n").unwrap();
        assert!(read_env_file(path)
            .unwrap_err()
            .contains(":1: expected NAME=VALUE"));
        let link = dir.path().join("link.env");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = read_env_file(link.to_str().unwrap()).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
    }
}
