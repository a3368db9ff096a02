//! Pools in the layout of the `zpool` commands: `status` with its config
//! tree, `list`, `iostat`, `import` candidates, and scan progress.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use tarn_api::pool::{
    CacheCounters, Counters, Health, ImportCandidate, IostatEntry, PoolListEntry, PoolStatus,
    ScanKind, ScanState, ScanStatus, VdevStatus,
};

use super::{format_count, format_date, format_duration, format_rate, format_size, percent, table};

fn scan_nouns(kind: ScanKind) -> (&'static str, &'static str) {
    match kind {
        ScanKind::Scrub => ("scrub", "repaired"),
        ScanKind::Resilver => ("resilver", "resilvered"),
    }
}

/// The `scan:` text of `status`: one line for a finished or canceled scan,
/// three (continuation lines indented by a tab) for a running or paused one.
pub fn scan_text(scan: &ScanStatus) -> String {
    let (noun, verb) = scan_nouns(scan.kind);
    let errors = match scan.errors {
        1 => "1 error".to_string(),
        n => format!("{n} errors"),
    };
    match scan.state {
        ScanState::Finished => {
            let took = scan
                .ended_unix
                .map_or(0, |end| end.saturating_sub(scan.started_unix));
            let on = scan.ended_unix.map(format_date).unwrap_or_default();
            let leading = match scan.kind {
                ScanKind::Scrub => format!("scrub repaired {}", format_size(scan.repaired_bytes)),
                ScanKind::Resilver => format!("resilvered {}", format_size(scan.repaired_bytes)),
            };
            format!(
                "{leading} in {} with {errors} on {on}",
                format_duration(took)
            )
        }
        ScanState::Canceled => {
            let on = scan.ended_unix.map(format_date).unwrap_or_default();
            format!("{noun} canceled on {on}")
        }
        ScanState::Scanning | ScanState::Paused => {
            let head = if scan.state == ScanState::Paused {
                format!("{noun} paused, started {}", format_date(scan.started_unix))
            } else {
                format!(
                    "{noun} in progress since {}",
                    format_date(scan.started_unix)
                )
            };
            let mut progress = format!(
                "{} / {} scanned",
                format_size(scan.examined_bytes),
                format_size(scan.total_bytes)
            );
            if scan.state == ScanState::Scanning {
                let _ = write!(progress, " at {}", format_rate(scan.rate_bytes_per_sec));
            }
            let _ = write!(
                progress,
                ", {:.2}% done",
                percent(scan.examined_bytes, scan.total_bytes)
            );
            if let (ScanState::Scanning, Some(eta)) = (scan.state, scan.eta_secs) {
                let _ = write!(progress, ", {} to go", format_duration(eta));
            }
            format!(
                "{head}\n\t{progress}\n\t{} {verb}, {errors}",
                format_size(scan.repaired_bytes)
            )
        }
    }
}

fn sum_counters(vdevs: &[VdevStatus]) -> Counters {
    let mut total = Counters::default();
    for v in vdevs {
        let c = &v.counters;
        total.read_errors += c.read_errors;
        total.write_errors += c.write_errors;
        total.cksum_errors += c.cksum_errors;
        total.read_ops += c.read_ops;
        total.write_ops += c.write_ops;
        total.read_bytes += c.read_bytes;
        total.write_bytes += c.write_bytes;
    }
    total
}

struct TreeRow {
    name: String,
    health: Health,
    counters: Counters,
    note: Option<String>,
}

fn tree_rows(vdev: &VdevStatus, depth: usize, rows: &mut Vec<TreeRow>) {
    rows.push(TreeRow {
        name: format!("{}{}", "  ".repeat(depth), vdev.name),
        health: vdev.health,
        counters: vdev.counters.clone(),
        note: vdev.note.clone(),
    });
    for child in &vdev.children {
        tree_rows(child, depth + 1, rows);
    }
}

/// One pool in the layout of `zpool status`.
pub fn render_pool_status(pool: &PoolStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "  pool: {}", pool.name);
    let _ = writeln!(out, " state: {}", pool.health);
    if let Some(message) = &pool.message {
        let _ = writeln!(out, "status: {message}");
    }
    if let Some(action) = &pool.action {
        let _ = writeln!(out, "action: {action}");
    }
    match &pool.scan {
        Some(scan) => {
            let _ = writeln!(out, "  scan: {}", scan_text(scan));
        }
        None => out.push_str("  scan: none requested\n"),
    }
    if let Some(cache) = &pool.cache {
        let _ = writeln!(out, " cache: {}", cache_text(cache));
    }
    out.push_str("config:\n\n");

    let mut rows = vec![TreeRow {
        name: pool.name.clone(),
        health: pool.health,
        counters: sum_counters(&pool.vdevs),
        note: None,
    }];
    for vdev in &pool.vdevs {
        tree_rows(vdev, 1, &mut rows);
    }
    // Separate log devices, under their own heading as zpool shows them.
    let mut log_rows = Vec::new();
    for vdev in &pool.logs {
        tree_rows(vdev, 1, &mut log_rows);
    }
    let width = rows
        .iter()
        .chain(&log_rows)
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .max(10);
    let _ = writeln!(
        out,
        "\t{:<width$}  {:<8}  {:>5} {:>5} {:>5}",
        "NAME", "STATE", "READ", "WRITE", "CKSUM"
    );
    let heading = TreeRow {
        name: "logs".to_string(),
        health: pool.health,
        counters: Counters::default(),
        note: None,
    };
    let logs_at = rows.len();
    let all: Vec<&TreeRow> = rows
        .iter()
        .chain((!log_rows.is_empty()).then_some(&heading))
        .chain(&log_rows)
        .collect();
    for (i, row) in all.into_iter().enumerate() {
        if i == logs_at {
            let _ = writeln!(out, "\t{}", row.name);
            continue;
        }
        let line = format!(
            "\t{:<width$}  {:<8}  {:>5} {:>5} {:>5}  {}",
            row.name,
            row.health.to_string(),
            format_count(row.counters.read_errors),
            format_count(row.counters.write_errors),
            format_count(row.counters.cksum_errors),
            row.note.as_deref().unwrap_or("")
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out.push('\n');
    if pool.damaged.is_empty() {
        out.push_str("errors: No known data errors\n");
    } else {
        let _ = writeln!(
            out,
            "errors: Permanent errors have been detected in the following {}:\n",
            if pool.damaged.len() == 1 {
                "object"
            } else {
                "objects"
            }
        );
        for name in &pool.damaged {
            let _ = writeln!(out, "        {name}");
        }
    }
    if !pool.locked.is_empty() {
        let _ = writeln!(
            out,
            "locked: encrypted, key not loaded (`tarn key load ROOT`):"
        );
        for name in &pool.locked {
            let _ = writeln!(out, "        {name}");
        }
    }
    out
}

/// A hit ratio as a percentage with one decimal, or `-` before any lookup.
fn hit_ratio(hits: u64, misses: u64) -> String {
    match hits + misses {
        0 => "-".to_string(),
        n => format!("{:.1}%", hits as f64 * 100.0 / n as f64),
    }
}

/// The `cache:` line of `status`: how full the block cache is and how
/// often it answered since the daemon started.
pub fn cache_text(c: &CacheCounters) -> String {
    format!(
        "{} of {} in {} blocks; hits: data {}, metadata {}; read ahead {} blocks, {} used",
        format_size(c.bytes),
        format_size(c.max_bytes),
        format_count(c.blocks),
        hit_ratio(c.data_hits, c.data_misses),
        hit_ratio(c.meta_hits, c.meta_misses),
        format_count(c.prefetched),
        format_count(c.prefetch_hits),
    )
}

/// The block cache under `iostat -v`: totals in the first report, then
/// lookups per second and hit ratios over each interval, like the device
/// rows above it.
pub fn render_cache_iostat(
    current: &CacheCounters,
    previous: Option<(&CacheCounters, Duration)>,
) -> String {
    let d = |now: u64, then: u64| now.saturating_sub(then);
    let (c, per) = match previous {
        None => (*current, None),
        Some((p, elapsed)) => (
            CacheCounters {
                data_hits: d(current.data_hits, p.data_hits),
                data_misses: d(current.data_misses, p.data_misses),
                meta_hits: d(current.meta_hits, p.meta_hits),
                meta_misses: d(current.meta_misses, p.meta_misses),
                evicted: d(current.evicted, p.evicted),
                prefetched: d(current.prefetched, p.prefetched),
                prefetch_hits: d(current.prefetch_hits, p.prefetch_hits),
                ..*current
            },
            Some(elapsed.as_secs_f64().max(1e-3)),
        ),
    };
    let n = |v: u64| match per {
        None => format_count(v),
        Some(secs) => format!("{}/s", format_count((v as f64 / secs).round() as u64)),
    };
    let rows = vec![
        vec![
            "cache".to_string(),
            "size".to_string(),
            "hits".to_string(),
            "misses".to_string(),
            "hit%".to_string(),
        ],
        vec![
            "  data".to_string(),
            format!("{}/{}", format_size(c.bytes), format_size(c.max_bytes)),
            n(c.data_hits),
            n(c.data_misses),
            hit_ratio(c.data_hits, c.data_misses),
        ],
        vec![
            "  metadata".to_string(),
            String::new(),
            n(c.meta_hits),
            n(c.meta_misses),
            hit_ratio(c.meta_hits, c.meta_misses),
        ],
        vec![
            "  read-ahead".to_string(),
            String::new(),
            n(c.prefetch_hits),
            n(c.prefetched.saturating_sub(c.prefetch_hits)),
            hit_ratio(
                c.prefetch_hits,
                c.prefetched.saturating_sub(c.prefetch_hits),
            ),
        ],
    ];
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let mut line = format!("{:<w$}", r[0], w = widths[0]);
        for (cell, w) in r[1..].iter().zip(&widths[1..]) {
            let _ = write!(line, "  {cell:>w$}");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// Several pools, separated by blank lines; a sentence when there are none.
pub fn render_status(pools: &[PoolStatus]) -> String {
    if pools.is_empty() {
        return "no pools available\n".to_string();
    }
    pools
        .iter()
        .map(render_pool_status)
        .collect::<Vec<_>>()
        .join("\n")
}

/// `zpool list`: NAME SIZE ALLOC FREE CAP HEALTH.
pub fn render_list(pools: &[PoolListEntry]) -> String {
    if pools.is_empty() {
        return "no pools available\n".to_string();
    }
    let rows: Vec<Vec<String>> = pools
        .iter()
        .map(|p| {
            // Allocated and free are both in the allocator's units, so their
            // sum is the right denominator for the fill level.
            let room = p.allocated.saturating_add(p.free);
            let cap = if room == 0 {
                "-".to_string()
            } else {
                format!("{:.0}%", percent(p.allocated, room).floor())
            };
            vec![
                p.name.clone(),
                format_size(p.size),
                format_size(p.allocated),
                format_size(p.free),
                cap,
                p.health.to_string(),
            ]
        })
        .collect();
    table(
        &["NAME", "SIZE", "ALLOC", "FREE", "CAP", "HEALTH"],
        &rows,
        &[0, 5],
    )
}

/// `import` without a pool: what could be imported, like `zpool import`.
pub fn render_candidates(candidates: &[ImportCandidate]) -> String {
    if candidates.is_empty() {
        return "no pools available to import\n".to_string();
    }
    let mut out = String::new();
    for (i, c) in candidates.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "   pool: {}", c.name);
        let _ = writeln!(out, "     id: {}", c.guid);
        let _ = writeln!(out, "  state: {}", c.health);
        if let Some(note) = &c.note {
            let _ = writeln!(out, " status: {note}");
        }
        let action = if c.active {
            format!(
                "The pool may be in use by another daemon. If it is not, import it with \
                 `tarn pool import -f {}`.",
                c.name
            )
        } else if matches!(c.health, Health::Online | Health::Degraded) {
            format!(
                "The pool can be imported by name or id: `tarn pool import {}`.",
                c.name
            )
        } else {
            "The pool cannot be imported: too many devices are missing or damaged.".to_string()
        };
        let _ = writeln!(out, " action: {action}");
        out.push_str(" config:\n\n");
        let _ = writeln!(out, "\t{}  {}", c.name, c.health);
        for dev in &c.devices {
            let _ = writeln!(out, "\t  {dev}");
        }
    }
    out
}

/// `iostat`: capacity, operations and bandwidth per pool, top-level vdev and
/// leaf. Without `previous`, the numbers are totals since import; with the
/// previous sample and the time between the two, they are per-second rates
/// of the counter deltas (a row without a previous sample shows `-`).
pub fn render_iostat(
    current: &[IostatEntry],
    previous: Option<(&[IostatEntry], Duration)>,
) -> String {
    fn keyed(entries: &[IostatEntry]) -> HashMap<(String, String), &Counters> {
        let mut pool = String::new();
        let mut map = HashMap::new();
        for e in entries {
            if e.depth == 0 {
                pool = e.name.clone();
            }
            map.insert((pool.clone(), e.name.clone()), &e.counters);
        }
        map
    }
    if current.is_empty() {
        return "no pools available\n".to_string();
    }
    let before = previous.map(|(entries, elapsed)| (keyed(entries), elapsed.as_secs_f64()));
    let dash = || "-".to_string();
    let mut rows: Vec<Option<Vec<String>>> = Vec::new();
    let mut pool = String::new();
    for (i, e) in current.iter().enumerate() {
        if e.depth == 0 {
            if i > 0 {
                rows.push(None);
            }
            pool = e.name.clone();
        }
        let c = &e.counters;
        let numbers = match &before {
            None => Some([c.read_ops, c.write_ops, c.read_bytes, c.write_bytes]),
            Some((map, secs)) => map.get(&(pool.clone(), e.name.clone())).map(|p| {
                let per_sec = |now: u64, then: u64| {
                    (now.saturating_sub(then) as f64 / secs.max(1e-3)).round() as u64
                };
                [
                    per_sec(c.read_ops, p.read_ops),
                    per_sec(c.write_ops, p.write_ops),
                    per_sec(c.read_bytes, p.read_bytes),
                    per_sec(c.write_bytes, p.write_bytes),
                ]
            }),
        };
        let (alloc, free) = if e.depth >= 2 {
            (dash(), dash())
        } else {
            (format_size(e.allocated), format_size(e.free))
        };
        let mut row = vec![
            format!("{}{}", "  ".repeat(usize::from(e.depth)), e.name),
            alloc,
            free,
        ];
        match numbers {
            Some([ro, wo, rb, wb]) => row.extend([
                format_count(ro),
                format_count(wo),
                format_size(rb),
                format_size(wb),
            ]),
            None => row.extend([dash(), dash(), dash(), dash()]),
        }
        rows.push(Some(row));
    }
    let name_w = rows
        .iter()
        .flatten()
        .map(|r| r[0].len())
        .max()
        .unwrap_or(0)
        .max(12);
    let rule = format!("{}  {}", "-".repeat(name_w), ["-----"; 6].join("  "));
    let line = |cells: &[String]| {
        let mut s = format!("{:<name_w$}", cells[0]);
        for cell in &cells[1..] {
            let _ = write!(s, "  {cell:>5}");
        }
        s
    };
    let mut out = String::new();
    let groups = format!(
        "{:<name_w$}  {:^12}  {:^12}  {:^12}",
        "", "capacity", "operations", "bandwidth"
    );
    let _ = writeln!(out, "{}", groups.trim_end());
    let header: Vec<String> = ["pool", "alloc", "free", "read", "write", "read", "write"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let _ = writeln!(out, "{}", line(&header));
    let _ = writeln!(out, "{rule}");
    for row in &rows {
        match row {
            Some(cells) => {
                let _ = writeln!(out, "{}", line(cells));
            }
            None => {
                let _ = writeln!(out, "{rule}");
            }
        }
    }
    let _ = writeln!(out, "{rule}");
    out
}

/// One line of progress for a running scan, drawn on a terminal:
/// `scrub [=====>      ]  42.0%  1.20G/2.86G  120M/s  ETA 00:00:14`.
pub fn progress_line(scan: &ScanStatus) -> String {
    const BAR: usize = 30;
    let pct = percent(scan.examined_bytes, scan.total_bytes);
    let filled = ((pct / 100.0) * BAR as f64).round() as usize;
    let filled = filled.min(BAR);
    let mut bar = "=".repeat(filled);
    if filled < BAR {
        bar.push('>');
        bar.push_str(&" ".repeat(BAR - filled - 1));
    }
    let (noun, _) = scan_nouns(scan.kind);
    let tail = match (scan.state, scan.eta_secs) {
        (ScanState::Paused, _) => "paused".to_string(),
        (_, Some(eta)) => format!("ETA {}", format_duration(eta)),
        (_, None) => "ETA --:--:--".to_string(),
    };
    format!(
        "{noun} [{bar}] {pct:5.1}%  {}/{}  {}  {tail}",
        format_size(scan.examined_bytes),
        format_size(scan.total_bytes),
        format_rate(scan.rate_bytes_per_sec)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cells of the first line of `text` that contains `needle` (a
    /// line starting with it, for a pool name that other lines contain).
    fn cells<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
        let line = text
            .lines()
            .find(|l| l.starts_with(needle))
            .or_else(|| text.lines().find(|l| l.contains(needle)))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"));
        line.split_whitespace().collect()
    }

    fn counters(read_errors: u64, cksum_errors: u64) -> Counters {
        Counters {
            read_errors,
            cksum_errors,
            ..Counters::default()
        }
    }

    fn leaf(name: &str, health: Health, c: Counters, note: Option<&str>) -> VdevStatus {
        VdevStatus {
            name: name.into(),
            health,
            counters: c,
            note: note.map(String::from),
            children: vec![],
        }
    }

    fn sample_status() -> PoolStatus {
        PoolStatus {
            name: "tank".into(),
            guid: "1f2e3d4c5b6a7988".into(),
            health: Health::Degraded,
            message: Some("One device is offline.".into()),
            action: Some("Bring it back with `tarn pool online tank /dev/sdc`.".into()),
            txg: 42,
            scan: Some(ScanStatus {
                kind: ScanKind::Scrub,
                state: ScanState::Finished,
                started_unix: 1_700_000_000,
                ended_unix: Some(1_700_003_723),
                examined_bytes: 10 << 30,
                total_bytes: 10 << 30,
                repaired_bytes: 4096,
                errors: 0,
                rate_bytes_per_sec: 0,
                eta_secs: None,
            }),
            vdevs: vec![VdevStatus {
                name: "mirror-0".into(),
                health: Health::Degraded,
                counters: counters(0, 3),
                note: None,
                children: vec![
                    leaf("/dev/sdb", Health::Online, counters(0, 3), None),
                    leaf(
                        "/dev/sdc",
                        Health::Offline,
                        Counters::default(),
                        Some("was /dev/sdc"),
                    ),
                ],
            }],
            logs: vec![leaf(
                "/dev/nvme0n1",
                Health::Online,
                Counters::default(),
                None,
            )],
            damaged: vec![],
            locked: vec![],
            cache: None,
        }
    }

    #[test]
    fn status_looks_like_zpool_status() {
        let text = render_status(&[sample_status()]);
        for expected in [
            "  pool: tank\n",
            " state: DEGRADED\n",
            "status: One device is offline.\n",
            "action: Bring it back",
            "  scan: scrub repaired 4K in 01:02:03 with 0 errors on ",
            "config:\n\n",
            "errors: No known data errors\n",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().find(|l| l.contains("NAME")).unwrap();
        for col in ["NAME", "STATE", "READ", "WRITE", "CKSUM"] {
            assert!(header.contains(col), "{header}");
        }
        let sdc = lines
            .iter()
            .find(|l| l.starts_with("\t    /dev/sdc"))
            .unwrap();
        assert!(
            sdc.contains("OFFLINE") && sdc.ends_with("was /dev/sdc"),
            "{sdc:?}"
        );
        // Log devices come last, under their own heading.
        let logs = lines.iter().position(|l| *l == "\tlogs").unwrap();
        assert!(
            lines[logs + 1].starts_with("\t  /dev/nvme0n1") && lines[logs + 1].contains("ONLINE"),
            "{text}"
        );
        let pool_row = lines.iter().find(|l| l.starts_with("\ttank ")).unwrap();
        assert!(
            pool_row.contains("DEGRADED") && pool_row.ends_with("3"),
            "{pool_row:?}"
        );
    }

    #[test]
    fn status_lists_damage_and_running_scans() {
        let mut pool = sample_status();
        pool.damaged = vec!["object drill-1 offset 131072".into()];
        pool.scan = Some(ScanStatus {
            kind: ScanKind::Resilver,
            state: ScanState::Scanning,
            started_unix: 1_700_000_000,
            ended_unix: None,
            examined_bytes: 1 << 30,
            total_bytes: 4 << 30,
            repaired_bytes: 1 << 20,
            errors: 1,
            rate_bytes_per_sec: 100 << 20,
            eta_secs: Some(30),
        });
        let text = render_pool_status(&pool);
        assert!(text.contains("resilver in progress since"), "{text}");
        assert!(
            text.contains("\t1G / 4G scanned at 100M/s, 25.00% done, 00:00:30 to go\n"),
            "{text}"
        );
        assert!(text.contains("\t1M resilvered, 1 error\n"), "{text}");
        assert!(text.contains("errors: Permanent errors"), "{text}");
        assert!(
            text.contains("        object drill-1 offset 131072\n"),
            "{text}"
        );
        assert!(pool.needs_attention());
        assert_eq!(render_status(&[]), "no pools available\n");
    }

    #[test]
    fn list_has_zpool_columns() {
        let text = render_list(&[PoolListEntry {
            name: "tank".into(),
            size: 10 << 30,
            allocated: 3 << 29,
            free: (10 << 30) - (3 << 29),
            health: Health::Online,
            guid: "ab".into(),
        }]);
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(header, ["NAME", "SIZE", "ALLOC", "FREE", "CAP", "HEALTH"]);
        let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(row, ["tank", "10G", "1.50G", "8.50G", "15%", "ONLINE"]);
    }

    #[test]
    fn iostat_totals_then_rates() {
        let entry = |name: &str, depth: u8, ops: u64| IostatEntry {
            name: name.into(),
            depth,
            allocated: if depth < 2 { 1 << 30 } else { 0 },
            free: if depth < 2 { 3 << 30 } else { 0 },
            counters: Counters {
                read_ops: ops,
                write_ops: ops * 2,
                read_bytes: ops * 4096,
                write_bytes: ops * 8192,
                ..Counters::default()
            },
        };
        let first = vec![
            entry("tank", 0, 100),
            entry("mirror-0", 1, 100),
            entry("/dev/sdb", 2, 50),
        ];
        let text = render_iostat(&first, None);
        assert!(
            text.contains("capacity") && text.contains("operations") && text.contains("bandwidth")
        );
        let tank: Vec<&str> = cells(&text, "tank");
        assert_eq!(tank, ["tank", "1G", "3G", "100", "200", "400K", "800K"]);
        let leaf: Vec<&str> = cells(&text, "/dev/sdb");
        assert_eq!(leaf, ["/dev/sdb", "-", "-", "50", "100", "200K", "400K"]);

        let mut second = first.clone();
        second[0] = entry("tank", 0, 300);
        second.push(entry("/dev/sdc", 2, 7));
        let text = render_iostat(&second, Some((&first, Duration::from_secs(2))));
        let tank: Vec<&str> = cells(&text, "tank");
        assert_eq!(tank, ["tank", "1G", "3G", "100", "200", "400K", "800K"]);
        let idle: Vec<&str> = cells(&text, "mirror-0");
        assert_eq!(idle, ["mirror-0", "1G", "3G", "0", "0", "0B", "0B"]);
        let new: Vec<&str> = cells(&text, "/dev/sdc");
        assert_eq!(new, ["/dev/sdc", "-", "-", "-", "-", "-", "-"]);
    }

    #[test]
    fn candidates_and_progress() {
        let text = render_candidates(&[ImportCandidate {
            name: "tank".into(),
            guid: "abc".into(),
            health: Health::Online,
            devices: vec!["/d/a".into(), "/d/b".into()],
            note: None,
            active: true,
        }]);
        assert!(text.contains("   pool: tank\n") && text.contains("     id: abc\n"));
        assert!(text.contains("tarn pool import -f tank") && text.contains("\t  /d/b\n"));
        assert_eq!(render_candidates(&[]), "no pools available to import\n");

        let mut scan = sample_status().scan.unwrap();
        scan.state = ScanState::Scanning;
        scan.examined_bytes = scan.total_bytes / 2;
        scan.eta_secs = Some(61);
        let line = progress_line(&scan);
        assert!(line.starts_with("scrub [===============>"), "{line}");
        assert!(
            line.contains(" 50.0%") && line.ends_with("ETA 00:01:01"),
            "{line}"
        );
    }

    #[test]
    fn cache_totals_then_rates_over_the_interval() {
        let then = CacheCounters {
            bytes: 3 << 20,
            max_bytes: 64 << 20,
            blocks: 3,
            data_hits: 10,
            data_misses: 30,
            meta_hits: 5,
            meta_misses: 0,
            evicted: 0,
            prefetched: 4,
            prefetch_hits: 1,
        };
        let line = cache_text(&then);
        assert!(line.starts_with("3M of 64M in 3 blocks"), "{line}");
        assert!(line.contains("data 25.0%, metadata 100.0%"), "{line}");
        let total = render_cache_iostat(&then, None);
        assert!(total.contains("25.0%") && total.contains("30"), "{total}");
        let now = CacheCounters {
            data_hits: 30,
            data_misses: 40,
            meta_hits: 5,
            ..then
        };
        // Over two seconds: 20 hits and 10 misses, 10/s and 5/s, 66.7%.
        let rates = render_cache_iostat(&now, Some((&then, Duration::from_secs(2))));
        assert_eq!(
            cells(&rates, "data")[2..],
            ["10/s", "5/s", "66.7%"],
            "{rates}"
        );
        assert_eq!(
            cells(&rates, "metadata")[1..],
            ["0/s", "0/s", "-"],
            "{rates}"
        );
    }
}
