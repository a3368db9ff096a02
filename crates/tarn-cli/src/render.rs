//! Human output, shaped like the `zpool` commands people already read:
//! `status` with its config tree, `list`, `iostat`, `import` candidates,
//! and the numbers inside them (sizes like `1.50G`, durations, dates).
//!
//! Every function returns a `String`, so tests can check output without a
//! terminal and the CLI decides where it goes.
//!
//! This module holds the numbers (sizes, counts, durations, dates) and the
//! table layout; `pools` renders pools (status, list, iostat, import
//! candidates, scan progress) and `datasets` datasets, properties, mounts,
//! users, shares and objects.

use std::fmt::Write as _;

mod datasets;
mod pools;

pub use datasets::{
    render_datasets, render_keys, render_mounts, render_objects, render_props, render_shares,
    render_users, render_volumes,
};
pub use pools::{
    cache_text, progress_line, render_cache_iostat, render_candidates, render_iostat, render_list,
    render_pool_status, render_status, scan_text,
};

const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];

/// Formats `n` with a unit suffix so that at most three significant digits
/// show: `0`, `999`, `1.50`, `10.5`, `100`, exact multiples without decimals.
fn nicenum(n: u64, base: u64) -> (String, &'static str) {
    if n < base {
        return (n.to_string(), UNITS[0]);
    }
    let mut unit = 0;
    let mut divisor: u128 = 1;
    while unit < UNITS.len() - 1 && u128::from(n) >= divisor * u128::from(base) {
        divisor *= u128::from(base);
        unit += 1;
    }
    if u128::from(n) % divisor == 0 {
        return ((u128::from(n) / divisor).to_string(), UNITS[unit]);
    }
    let value = n as f64 / divisor as f64;
    let text = [2usize, 1, 0]
        .iter()
        .map(|&p| format!("{value:.p$}"))
        .find(|s| s.len() <= 4)
        .unwrap_or_else(|| format!("{value:.0}"));
    // Rounding can carry into the next unit: 1023.9K shows as 1.00M.
    if unit < UNITS.len() - 1 && text.parse::<f64>().is_ok_and(|v| v >= base as f64) {
        return ("1.00".to_string(), UNITS[unit + 1]);
    }
    (text, UNITS[unit])
}

/// A byte count in binary units: `0B`, `512B`, `1.50G`, `10.5M`, `16E`.
pub fn format_size(bytes: u64) -> String {
    let (num, unit) = nicenum(bytes, 1024);
    if unit.is_empty() {
        format!("{num}B")
    } else {
        format!("{num}{unit}")
    }
}

/// A count in decimal units: `0`, `999`, `1.20K`, `3M`.
pub fn format_count(count: u64) -> String {
    let (num, unit) = nicenum(count, 1000);
    format!("{num}{unit}")
}

/// A rate in bytes per second: `120M/s`.
pub fn format_rate(bytes_per_sec: u64) -> String {
    format!("{}/s", format_size(bytes_per_sec))
}

/// A duration as `HH:MM:SS`, with a day count in front past 24 hours.
pub fn format_duration(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let hms = format!(
        "{:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    );
    if days > 0 {
        format!("{days}d {hms}")
    } else {
        hms
    }
}

/// A table of tokens (replication or API): label, what each is for
/// (`scope`: DATASET or USER), when it was made; never the tokens.
pub fn token_table<'a>(scope: &str, rows: impl Iterator<Item = (&'a str, &'a str, u64)>) -> String {
    let rows: Vec<Vec<String>> = rows
        .map(|(label, what, created)| {
            vec![label.to_string(), what.to_string(), format_date(created)]
        })
        .collect();
    table(&["LABEL", scope, "CREATED"], &rows, &[0, 1, 2])
}

/// A Unix time in local time, as `ctime` writes it: `Sun Mar  1 12:00:00 2026`.
pub fn format_date(unix: u64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let Ok(t) = libc::time_t::try_from(unix) else {
        return format!("@{unix}");
    };
    // SAFETY: `tm` is plain C data that localtime_r fills in; both pointers
    // are valid for the call.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return format!("@{unix}");
        }
        tm
    };
    let day = usize::try_from(tm.tm_wday).ok().and_then(|i| DAYS.get(i));
    let month = usize::try_from(tm.tm_mon).ok().and_then(|i| MONTHS.get(i));
    match (day, month) {
        (Some(day), Some(month)) => format!(
            "{day} {month} {:2} {:02}:{:02}:{:02} {}",
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec,
            i64::from(tm.tm_year) + 1900
        ),
        _ => format!("@{unix}"),
    }
}

pub(crate) fn percent(done: u64, total: u64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    (done as f64 * 100.0 / total as f64).min(100.0)
}

/// Formats rows as left-aligned first column and right-aligned others.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>], left_columns: &[usize]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if left_columns.contains(&i) {
                let _ = write!(line, "{cell:<w$}");
            } else {
                let _ = write!(line, "{cell:>w$}");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// `tarn daemon stats`: one row per server, the counters since the start.
pub fn render_daemon_stats(stats: &tarn_api::params::DaemonStats) -> String {
    let servers = [
        ("admin", Some(&stats.admin)),
        ("nfs", stats.nfs.as_ref()),
        ("webdav", stats.webdav.as_ref()),
        ("nbd", stats.nbd.as_ref()),
        ("iscsi", stats.iscsi.as_ref()),
    ];
    let rows: Vec<Vec<String>> = servers
        .iter()
        .map(|(name, c)| match c {
            None => vec![name.to_string(), "not running".to_string()],
            Some(c) => [
                c.open,
                c.accepted,
                c.refused_per_address,
                c.refused_full,
                c.refused_unlisted,
                c.evicted,
                c.idle_closed,
                c.request_timeouts,
            ]
            .iter()
            .map(|n| n.to_string())
            .fold(vec![name.to_string()], |mut row, n| {
                row.push(n);
                row
            }),
        })
        .collect();
    let mut out = table(
        &[
            "SERVER",
            "OPEN",
            "ACCEPTED",
            "REFUSED-ADDR",
            "REFUSED-FULL",
            "REFUSED-OTHER",
            "EVICTED",
            "IDLE-CLOSED",
            "TIMED-OUT",
        ],
        &rows,
        &[0],
    );
    out.push_str(
        "REFUSED-ADDR: the client address held its per-address limit; REFUSED-FULL: every \
         connection was running a request; REFUSED-OTHER: not allowed at all (NFS: no export \
         lists the address; admin: another user); EVICTED: idle connections closed for a \
         newcomer; TIMED-OUT: a request line too slow to arrive\n",
    );
    if let Some(smb) = &stats.smb {
        let _ = writeln!(
            out,
            "smb: {} on {}, {} share(s), restarted {} time(s){}",
            match smb.pid {
                Some(pid) => format!("smbd running (pid {pid})"),
                None => "smbd NOT running (being restarted)".to_string(),
            },
            smb.address,
            smb.shares.len(),
            smb.restarts,
            match &smb.last_exit {
                Some(how) => format!("; last ended: {how} at unix time {}", smb.last_exit_unix),
                None => String::new(),
            }
        );
        for p in &smb.problems {
            let _ = writeln!(out, "smb: {p}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_stats_say_when_smbd_is_down_and_why_it_ended() {
        let stats = tarn_api::params::DaemonStats {
            smb: Some(tarn_api::params::SmbStatus {
                address: "0.0.0.0:445".into(),
                pid: None,
                restarts: 2,
                last_exit: Some("killed by signal 9".into()),
                last_exit_unix: 5,
                shares: vec!["a".into()],
                problems: vec!["share 'b' is not served over SMB: x".into()],
            }),
            ..Default::default()
        };
        let text = render_daemon_stats(&stats);
        assert!(text.contains("smbd NOT running"), "{text}");
        assert!(text.contains("restarted 2 time(s)"), "{text}");
        assert!(text.contains("killed by signal 9"), "{text}");
        assert!(text.contains("smb: share 'b' is not served"), "{text}");
    }

    #[test]
    fn daemon_stats_show_every_counter_and_absent_servers() {
        let stats = tarn_api::params::DaemonStats {
            admin: tarn_api::params::ConnCounters {
                open: 1,
                accepted: 2,
                refused_unlisted: 3,
                evicted: 4,
                idle_closed: 5,
                request_timeouts: 6,
                ..Default::default()
            },
            nfs: Some(tarn_api::params::ConnCounters {
                refused_per_address: 7,
                refused_full: 8,
                ..Default::default()
            }),
            webdav: None,
            nbd: Some(tarn_api::params::ConnCounters {
                open: 9,
                ..Default::default()
            }),
            iscsi: Some(tarn_api::params::ConnCounters {
                accepted: 10,
                ..Default::default()
            }),
            smb: None,
        };
        let text = render_daemon_stats(&stats);
        assert!(!text.contains("smb:"), "no SMB line without SMB");
        let lines: Vec<&str> = text.lines().collect();
        let cells = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[1]),
            ["admin", "1", "2", "0", "0", "3", "4", "5", "6"]
        );
        assert_eq!(
            cells(lines[2]),
            ["nfs", "0", "0", "7", "8", "0", "0", "0", "0"]
        );
        assert_eq!(cells(lines[3]), ["webdav", "not", "running"]);
        assert_eq!(
            cells(lines[4]),
            ["nbd", "9", "0", "0", "0", "0", "0", "0", "0"]
        );
        assert_eq!(
            cells(lines[5]),
            ["iscsi", "0", "10", "0", "0", "0", "0", "0", "0"]
        );
    }

    #[test]
    fn sizes_and_counts() {
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size(512), "512B");
        assert_eq!(format_size(1024), "1K");
        assert_eq!(format_size(1536), "1.50K");
        assert_eq!(format_size(3 << 29), "1.50G");
        assert_eq!(format_size(10 << 30), "10G");
        assert_eq!(format_size((10 << 20) + (1 << 19)), "10.5M");
        assert_eq!(format_size((100 << 30) + 1), "100G");
        assert_eq!(format_size((1 << 20) - 1), "1.00M");
        assert_eq!(format_size(u64::MAX), "16.0E");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(1200), "1.20K");
        assert_eq!(format_count(3_000_000), "3M");
        assert_eq!(format_duration(3723), "01:02:03");
        assert_eq!(format_duration(90_061), "1d 01:01:01");
    }
}
