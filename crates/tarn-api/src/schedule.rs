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

/// How often a scrub, self-test or replication schedule runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Every {
    /// Once an hour (replication only; API 2.4).
    Hourly,
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
    /// by the retention. Only snapshots named so are pruned; a held
    /// snapshot, one with clones, and the newest are never.
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
    /// A SMART self-test of every disk of the pool (file devices have none
    /// and are skipped). API 2.4.
    Selftest {
        /// Short or long.
        test: SelfTest,
        /// How often (daily, weekly or monthly).
        every: Every,
        /// Not before this hour of the day (UTC, 0 to 23).
        #[serde(default)]
        at_hour: u8,
    },
    /// Replication of a dataset's newest snapshot to another tarn or an
    /// object store, as `tarn replicate` does it (the daemon runs that
    /// command). API 2.4.
    Replicate {
        /// The dataset whose snapshots are sent.
        dataset: String,
        /// Where: `tarn://HOST[:PORT]/POOL/DATASET` or `s3://BUCKET/PREFIX`.
        to: String,
        /// Send the newest snapshot whose name starts with `PREFIX-` (a
        /// snapshot policy's); none: the newest snapshot of any name.
        #[serde(default)]
        prefix: Option<String>,
        /// How often.
        every: Every,
        /// Not before this hour of the day (UTC; daily and longer).
        #[serde(default)]
        at_hour: u8,
        /// tarn://: the file with the receiver's token (read by the
        /// daemon at each run).
        #[serde(default)]
        token_file: Option<String>,
        /// tarn://: the SHA-256 of the receiver's certificate.
        #[serde(default)]
        fingerprint: Option<String>,
        /// s3://: a file of `NAME=VALUE` lines with the store's
        /// credentials and endpoint (`AWS_ACCESS_KEY_ID`, …), mode 0600,
        /// read by the daemon at each run.
        #[serde(default)]
        env_file: Option<String>,
    },
}

impl Every {
    /// `hourly`, `daily`, `weekly` or `monthly`: the name in the JSON,
    /// in stored records and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Every::Hourly => "hourly",
            Every::Daily => "daily",
            Every::Weekly => "weekly",
            Every::Monthly => "monthly",
        }
    }

    /// The period of that name.
    pub fn parse(name: &str) -> Option<Every> {
        [Every::Hourly, Every::Daily, Every::Weekly, Every::Monthly]
            .into_iter()
            .find(|e| e.name() == name)
    }
}

/// Which SMART self-test a self-test schedule starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SelfTest {
    /// A couple of minutes: electrical and mechanical checks and a read of
    /// part of the surface.
    Short,
    /// Hours: a read of the whole surface.
    Long,
}

impl SelfTest {
    /// `short` or `long`, as smartctl names it.
    pub fn name(self) -> &'static str {
        match self {
            SelfTest::Short => "short",
            SelfTest::Long => "long",
        }
    }

    /// The test of that name.
    pub fn parse(name: &str) -> Option<SelfTest> {
        [SelfTest::Short, SelfTest::Long]
            .into_iter()
            .find(|t| t.name() == name)
    }
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
    let check_dataset = |dataset: &String| {
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
        Ok(())
    };
    let check_prefix = |prefix: &String| {
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
        Ok(())
    };
    let check_hour = |at_hour: u8| {
        if at_hour > 23 {
            return Err(ApiError::invalid("--at is an hour of the day, 0 to 23"));
        }
        Ok(())
    };
    let check_path = |what: &str, p: &Option<String>| {
        if p.as_ref().is_some_and(|p| !p.starts_with('/')) {
            return Err(ApiError::invalid(format!(
                "{what} must be an absolute path (the daemon reads it)"
            )));
        }
        Ok(())
    };
    match &s.kind {
        ScheduleKind::Snapshot {
            dataset,
            keep,
            prefix,
            ..
        } => {
            check_dataset(dataset)?;
            if *keep == Retention::default() {
                return Err(ApiError::invalid(
                    "a snapshot policy must keep something: --keep hourly=24,daily=30,…",
                ));
            }
            check_prefix(prefix)?;
        }
        ScheduleKind::Selftest { every, at_hour, .. } => {
            check_hour(*at_hour)?;
            if *every == Every::Hourly {
                return Err(ApiError::invalid(
                    "a self-test schedule runs daily, weekly or monthly",
                ));
            }
        }
        ScheduleKind::Replicate {
            dataset,
            to,
            prefix,
            every,
            at_hour,
            token_file,
            fingerprint,
            env_file,
        } => {
            check_dataset(dataset)?;
            check_hour(*at_hour)?;
            if *every == Every::Hourly && *at_hour != 0 {
                return Err(ApiError::invalid("--at goes with daily or longer periods"));
            }
            if let Some(p) = prefix {
                check_prefix(p)?;
            }
            check_path("--token-file", token_file)?;
            check_path("--env-file", env_file)?;
            if to.starts_with("tarn://") {
                if token_file.is_none() || fingerprint.is_none() {
                    return Err(ApiError::invalid(
                        "replication to tarn:// needs --token-file and --fingerprint",
                    ));
                }
                if env_file.is_some() {
                    return Err(ApiError::invalid("--env-file goes with s3:// targets"));
                }
            } else if to.starts_with("s3://") {
                if token_file.is_some() || fingerprint.is_some() {
                    return Err(ApiError::invalid(
                        "--token-file and --fingerprint go with tarn:// targets",
                    ));
                }
                if env_file.is_none() {
                    return Err(ApiError::invalid(
                        "replication to s3:// needs --env-file with the store's credentials",
                    ));
                }
            } else {
                return Err(ApiError::invalid(format!(
                    "'{to}': replicate to tarn://HOST[:PORT]/POOL/DATASET or s3://BUCKET/PREFIX"
                )));
            }
            if to.len() > 512 || to.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(ApiError::invalid(format!("'{to}' is not a usable URL")));
            }
        }
        ScheduleKind::Scrub {
            every,
            at_hour,
            pause,
        } => {
            check_hour(*at_hour)?;
            if *every == Every::Hourly {
                return Err(ApiError::invalid(
                    "a scrub schedule runs daily, weekly or monthly",
                ));
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
        let mut hourly = scrub(2, None);
        if let ScheduleKind::Scrub { every, .. } = &mut hourly.kind {
            *every = Every::Hourly;
        }
        assert!(check_schedule(&hourly).is_err(), "no hourly scrubs");
        assert!(check_schedule(&scrub(24, None)).is_err());
        assert!(check_schedule(&scrub(2, Some((8, 8)))).is_err());
    }

    fn replicate(to: &str, token: Option<&str>, fp: Option<&str>, env: Option<&str>) -> Schedule {
        Schedule {
            name: "offsite".into(),
            pool: "tank".into(),
            kind: ScheduleKind::Replicate {
                dataset: "tank/a".into(),
                to: to.into(),
                prefix: Some("auto".into()),
                every: Every::Daily,
                at_hour: 1,
                token_file: token.map(Into::into),
                fingerprint: fp.map(Into::into),
                env_file: env.map(Into::into),
            },
        }
    }

    #[test]
    fn replication_schedules_are_checked() {
        check_schedule(&replicate("s3://b/p", None, None, Some("/etc/tarn/s3.env"))).unwrap();
        check_schedule(&replicate("tarn://h/vault/a", Some("/t"), Some("ab"), None)).unwrap();
        let refused = [
            replicate("tarn://h/vault/a", None, Some("ab"), None),
            replicate("tarn://h/vault/a", Some("/t"), None, None),
            replicate("tarn://h/vault/a", Some("/t"), Some("ab"), Some("/e")),
            replicate("s3://b/p", Some("/t"), None, None),
            replicate("s3://b/p", None, None, Some("relative.env")),
            replicate("s3://b/p", None, None, None),
            replicate("http://b/p", None, None, None),
            replicate("s3://b/p q", None, None, None),
        ];
        for r in refused {
            assert!(check_schedule(&r).is_err(), "{r:?}");
        }
        let j = serde_json::to_string(&replicate("s3://b/p", None, None, Some("/e"))).unwrap();
        assert_eq!(
            j,
            r#"{"name":"offsite","pool":"tank","kind":{"replicate":{"dataset":"tank/a","to":"s3://b/p","prefix":"auto","every":"daily","at_hour":1,"token_file":null,"fingerprint":null,"env_file":"/e"}}}"#
        );
        let t = Schedule {
            name: "t".into(),
            pool: "tank".into(),
            kind: ScheduleKind::Selftest {
                test: SelfTest::Long,
                every: Every::Hourly,
                at_hour: 3,
            },
        };
        assert!(check_schedule(&t).is_err(), "no hourly self-tests");
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
