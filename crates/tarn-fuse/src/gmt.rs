//! Snapshot names by time, for mounts that Samba serves.
//!
//! Samba's shadow-copy module shows the snapshots of a share to Windows
//! ("Previous Versions") and macOS clients only if the directories in the
//! snapshot folder are named by the time they were taken, in the form
//! `@GMT-YYYY.MM.DD-HH.MM.SS`. tarn's snapshots carry names their owners
//! chose, so a mount made for Samba lists `.snapshot` under those time
//! names instead (and looks them up by them); the snapshots themselves
//! are untouched. Two snapshots taken within the same second would get one
//! name: the older keeps it and the younger is not listed, which is what
//! a client could not tell apart anyway.

/// The `@GMT-…` name of a snapshot taken at `secs` (UTC, seconds since
/// the epoch).
pub fn gmt_name(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "@GMT-{y:04}.{m:02}.{d:02}-{:02}.{:02}.{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's
/// proleptic Gregorian algorithm, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// The time names of `snapshots` (name, creation time; oldest first) as
/// (time name, real name), each time name once: the first snapshot of a
/// second keeps it.
pub fn by_time(snapshots: &[(String, u64)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(snapshots.len());
    for (name, t) in snapshots {
        let g = gmt_name(*t);
        if !out.iter().any(|(o, _)| *o == g) {
            out.push((g, name.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_times() {
        assert_eq!(gmt_name(0), "@GMT-1970.01.01-00.00.00");
        assert_eq!(gmt_name(951_782_400), "@GMT-2000.02.29-00.00.00");
        assert_eq!(gmt_name(1_700_000_000), "@GMT-2023.11.14-22.13.20");
        assert_eq!(gmt_name(4_102_444_799), "@GMT-2099.12.31-23.59.59");
    }

    #[test]
    fn one_name_per_second_the_oldest_keeps_it() {
        let l = vec![
            ("a".to_string(), 10),
            ("b".to_string(), 10),
            ("c".to_string(), 11),
        ];
        let t = by_time(&l);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].1, "a");
        assert_eq!(t[1].1, "c");
    }

    proptest! {
        /// Day by day, the date advances by exactly one calendar day.
        #[test]
        fn consecutive_days_are_consecutive_dates(days in 0u64..200_000) {
            let (y0, m0, d0) = civil_from_days(days);
            let (y1, m1, d1) = civil_from_days(days + 1);
            let leap = |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
            let len = [31, if leap(y0) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
            prop_assert!((1..=12).contains(&m0));
            prop_assert!(d0 >= 1 && d0 <= len[(m0 - 1) as usize]);
            if d0 < len[(m0 - 1) as usize] {
                prop_assert_eq!((y1, m1, d1), (y0, m0, d0 + 1));
            } else if m0 < 12 {
                prop_assert_eq!((y1, m1, d1), (y0, m0 + 1, 1));
            } else {
                prop_assert_eq!((y1, m1, d1), (y0 + 1, 1, 1));
            }
        }
    }
}
