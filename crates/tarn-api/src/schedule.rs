//! Schedules as the API shows them: snapshot policies with retention and
//! scrub schedules, stored in the pool they act on and run by the daemon
//! (what sanoid and a NAS's periodic tasks do). The daemon stores them in
//! its own record types of the same JSON shape.

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// How many snapshots of each age a snapshot policy keeps: the newest
/// `hourly` hours, `daily` days, … each keep the first snapshot the policy
/// took in it. The finest period with a count above zero says how often
/// the policy takes a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    /// Hours.
    pub hourly: u32,
    /// Days.
    pub daily: u32,
    /// Weeks (Monday to Sunday).
    pub weekly: u32,
    /// Calendar months.
    pub monthly: u32,
    /// Calendar years.
    pub yearly: u32,
}

/// How often a scrub schedule runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Every {
    /// Once a day.
    Daily,
    /// Once a week (in the week from Monday).
    Weekly,
    /// Once a calendar month.
    Monthly,
}

/// What a schedule does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum ScheduleKind {
    /// Snapshots of a dataset, named `PREFIX-YYYY-MM-DD-HHMM` (UTC), pruned
    /// by the retention. Only snapshots with the prefix are pruned; a
    /// held snapshot, one with clones, and the newest are never.
    Snapshot {
        /// The filesystem or volume.
        dataset: String,
        /// The datasets below it too, in the same instant.
        #[serde(default)]
        recursive: bool,
        /// What to keep.
        keep: Retention,
        /// The snapshot names' prefix ("auto" by default).
        #[serde(default = "auto")]
        prefix: String,
    },
    /// A scrub of the whole pool.
    Scrub {
        /// How often.
        every: Every,
        /// Not before this hour of the day (UTC, 0 to 23).
        #[serde(default)]
        at_hour: u8,
        /// Hours (UTC) in which a running scrub is paused: `[from, to)`,
        /// e.g. 8 to 23 for a scrub that only runs at night. None: never.
        #[serde(default)]
        pause: Option<(u8, u8)>,
    },
}

fn auto() -> String {
    "auto".to_string()
}

/// A schedule: a name (unique in its pool) and what it does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Its name.
    pub name: String,
    /// The pool it is stored in and acts on.
    pub pool: String,
    /// What it does.
    pub kind: ScheduleKind,
}

/// One run of a schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// When it started (Unix seconds).
    pub started_unix: u64,
    /// It did everything it was to do.
    pub ok: bool,
    /// What it did or why it failed, in a line.
    pub detail: String,
}

/// A schedule as `schedule.list` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleInfo {
    /// The schedule.
    pub schedule: Schedule,
    /// Its latest runs, newest last (at most 20 are kept).
    pub runs: Vec<RunRecord>,
    /// When it is next due (Unix seconds), as far as the clock says now.
    pub next_due_unix: Option<u64>,
}

/// Checks a schedule before it is stored: a name like a share's, a
/// retention that keeps something, a prefix that makes valid snapshot
/// names, hours of the day.
pub fn check_schedule(s: &Schedule) -> Result<(), ApiError> {
    crate::access::check_name("schedule", &s.name)?;
    match &s.kind {
        ScheduleKind::Snapshot {
            dataset,
            keep,
            prefix,
            ..
        } => {
            let in_pool = dataset == &s.pool
                || dataset
                    .strip_prefix(s.pool.as_str())
                    .is_some_and(|r| r.starts_with('/'));
            if dataset.contains('@') || !in_pool {
                return Err(ApiError::invalid(format!(
                    "'{dataset}' is not a dataset of pool '{}'",
                    s.pool
                )));
            }
            if *keep == Retention::default() {
                return Err(ApiError::invalid(
                    "a snapshot policy must keep something: --keep hourly=24,daily=30,…",
                ));
            }
            let prefix_ok = !prefix.is_empty()
                && prefix.len() <= 32
                && prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !prefix_ok {
                return Err(ApiError::invalid(format!(
                    "invalid snapshot prefix '{prefix}': up to 32 letters, digits, '-', '_', '.'"
                )));
            }
        }
        ScheduleKind::Scrub { at_hour, pause, .. } => {
            if *at_hour > 23 {
                return Err(ApiError::invalid("--at is an hour of the day, 0 to 23"));
            }
            if let Some((a, b)) = pause {
                if *a > 23 || *b > 24 || a == b {
                    return Err(ApiError::invalid(
                        "--pause FROM-TO takes hours of the day (0 to 24), FROM different from TO",
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(keep: Retention, prefix: &str) -> Schedule {
        Schedule {
            name: "p".into(),
            pool: "tank".into(),
            kind: ScheduleKind::Snapshot {
                dataset: "tank/a".into(),
                recursive: false,
                keep,
                prefix: prefix.into(),
            },
        }
    }

    #[test]
    fn schedules_are_checked() {
        let keep = Retention {
            hourly: 24,
            ..Retention::default()
        };
        check_schedule(&snap(keep, "auto")).unwrap();
        assert!(check_schedule(&snap(Retention::default(), "auto")).is_err());
        assert!(check_schedule(&snap(keep, "a/b")).is_err());
        assert!(check_schedule(&snap(keep, "")).is_err());
        let mut other = snap(keep, "auto");
        other.pool = "vault".into();
        assert!(check_schedule(&other).is_err(), "a dataset of another pool");
        let scrub = |at_hour, pause| Schedule {
            name: "s".into(),
            pool: "tank".into(),
            kind: ScheduleKind::Scrub {
                every: Every::Monthly,
                at_hour,
                pause,
            },
        };
        check_schedule(&scrub(2, Some((8, 23)))).unwrap();
        assert!(check_schedule(&scrub(24, None)).is_err());
        assert!(check_schedule(&scrub(2, Some((8, 8)))).is_err());
    }

    #[test]
    fn the_json_shape_is_stable() {
        let s = snap(
            Retention {
                hourly: 24,
                daily: 30,
                ..Retention::default()
            },
            "auto",
        );
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(
            j,
            r#"{"name":"p","pool":"tank","kind":{"snapshot":{"dataset":"tank/a","recursive":false,"keep":{"hourly":24,"daily":30,"weekly":0,"monthly":0,"yearly":0},"prefix":"auto"}}}"#
        );
        assert_eq!(serde_json::from_str::<Schedule>(&j).unwrap(), s);
    }
}
