//! Events and alerts: what the owner should hear of, kept in a bounded
//! log and sent where the owner said (what ZFS's event daemon does).
//!
//! # Where events come from
//!
//! Most events are *observed*: the scheduler thread, after the schedules,
//! compares each pool's status with what it saw last time and turns the
//! differences into events (a device or pool changing health, new read,
//! write or checksum errors, a scan that ended, damage found, the pool
//! crossing 80 % or 90 % full). Observing instead of hooking every code
//! path that can change a state means no change is missed whatever caused
//! it, at the price of the scheduler's period (30 s) as latency. The
//! first look at a pool (daemon start, import) reports only what is
//! wrong, not every counter it finds. Other events are emitted where they
//! happen: a schedule that failed, and at start a daemon that was not
//! stopped cleanly (the `running` marker in the state directory was still
//! there).
//!
//! # The log
//!
//! `STATE/events.jsonl`: one JSON event per line, appended; the newest
//! 1,000 are kept (the file is rewritten when it holds twice that). Ids
//! increase across restarts.
//!
//! # Alerts and throttling
//!
//! Alerts (`STATE/alerts.json`, mode 0600: it may hold an SMTP password)
//! send events at or above their severity to a webhook (POST of the JSON,
//! retried with back-off on failure or a 5xx), an email (SMTP, STARTTLS
//! by default), or a program (the JSON on its stdin). Each delivery runs
//! on a thread of its own so a slow server delays nothing else. A flapping
//! device must not send a thousand mails: per alert, events of one kind
//! about one pool and device are sent at most once per throttle window
//! (10 minutes); the ones held back are counted, and the next one sent
//! says how many there were. A more severe event than the one last sent
//! goes at once (a pool at 90 % after the 80 % warning), and the newest
//! event held back is sent when the window ends if nothing else of its
//! kind came, so an alert is delayed, never lost.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tarn_api::events::{
    Alert, AlertInfo, AlertTarget, AlertTestResult, Event, Severity, SmtpSecurity,
};
use tarn_api::pool::{Health, ScanKind, ScanState, VdevStatus};
use tarn_api::{ApiError, Backend};

use crate::error::{DaemonError, Result};

/// Events kept in the log.
pub const KEEP: usize = 1000;

/// Per-alert delivery counters.
#[derive(Clone, Debug, Default)]
struct Stats {
    sent: u64,
    suppressed: u64,
    last_error: Option<String>,
    /// Deliveries running now (each on a thread of its own).
    in_flight: usize,
}

/// Most deliveries to one alert running at once. A webhook that accepts
/// connections and never answers keeps a delivery's thread for its
/// timeouts and retries (many minutes); without a bound, a burst of
/// events (a disk failing in several ways) would start a thread for each
/// and keep them all. Past the bound an event is not sent through that
/// alert (it stays in `tarn events`, and the alert's last error says
/// why); other alerts are not affected.
const MAX_IN_FLIGHT: usize = 4;

/// Held back per (alert, kind, pool, device): when one was last sent and
/// how many were held back since.
#[derive(Clone, Debug)]
struct Throttle {
    last_sent: Instant,
    /// The severity of the event last sent: a more severe one is sent at
    /// once (an 80 % warning does not hold back the 90 % critical).
    severity: Severity,
    held: u64,
    /// The newest event held back, sent when the window ends if no other
    /// event of the key came (so the last word is never lost).
    pending: Option<Event>,
}

impl Throttle {
    fn sent(severity: Severity) -> Throttle {
        Throttle {
            last_sent: Instant::now(),
            severity,
            held: 0,
            pending: None,
        }
    }
}

struct AlertState {
    list: Vec<Alert>,
    stats: BTreeMap<String, Stats>,
    throttle: HashMap<(String, String, Option<String>, Option<String>), Throttle>,
}

/// What the last look at a pool saw.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    health: Health,
    /// Leaf (and log) devices: health and error counters.
    leaves: BTreeMap<String, (Health, u64, u64, u64)>,
    scan: Option<(ScanKind, ScanState, u64)>,
    damaged: usize,
    /// 0, 80 or 90: the fullness level last reported.
    level: u8,
}

/// The event log, the alerts, and what was last seen of each pool.
pub struct Events {
    dir: PathBuf,
    log: Mutex<(VecDeque<Event>, u64, usize)>,
    alerts: Arc<Mutex<AlertState>>,
    seen: Mutex<BTreeMap<String, Seen>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn throttle_window() -> Duration {
    Duration::from_secs(
        std::env::var("TARN_ALERT_THROTTLE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600),
    )
}

impl Events {
    /// Opens the log and the alerts of the state directory `dir`, and
    /// records a crash if the last daemon did not stop cleanly.
    pub fn open(dir: &Path) -> Result<Events> {
        let path = dir.join("events.jsonl");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(DaemonError::msg(format!(
                    "cannot read {}: {e}",
                    path.display()
                )))
            }
        };
        let mut ring = VecDeque::new();
        let mut lines = 0;
        for line in text.lines() {
            lines += 1;
            // A line cut by a crash, or damaged, is skipped.
            if let Ok(e) = serde_json::from_str::<Event>(line) {
                ring.push_back(e);
                if ring.len() > KEEP {
                    ring.pop_front();
                }
            }
        }
        let next = ring.back().map(|e| e.id + 1).unwrap_or(1);
        let alerts_path = dir.join("alerts.json");
        let list: Vec<Alert> = match std::fs::read(&alerts_path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                DaemonError::msg(format!(
                    "{} cannot be read: {e}; repair it or move it aside",
                    alerts_path.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(DaemonError::msg(format!(
                    "cannot read {}: {e}",
                    alerts_path.display()
                )))
            }
        };
        let events = Events {
            dir: dir.to_path_buf(),
            log: Mutex::new((ring, next, lines)),
            alerts: Arc::new(Mutex::new(AlertState {
                list,
                stats: BTreeMap::new(),
                throttle: HashMap::new(),
            })),
            seen: Mutex::new(BTreeMap::new()),
        };
        let marker = dir.join("running");
        if marker.exists() {
            events.emit(
                Severity::Warning,
                "daemon.crashed",
                None,
                None,
                "the daemon was not stopped cleanly (a crash, a kill or a power cut); its pools \
                 were imported again and their intent logs replayed"
                    .to_string(),
            );
        }
        let _ = std::fs::write(&marker, std::process::id().to_string());
        Ok(events)
    }

    /// The daemon stops cleanly: the next start is not a crash.
    pub fn close(&self) {
        let _ = std::fs::remove_file(self.dir.join("running"));
    }

    /// Records an event and hands it to the alerts.
    pub fn emit(
        &self,
        severity: Severity,
        kind: &str,
        pool: Option<&str>,
        device: Option<&str>,
        message: String,
    ) {
        let event = {
            let mut log = lock(&self.log);
            let event = Event {
                id: log.1,
                time_unix: now_unix(),
                severity,
                kind: kind.to_string(),
                pool: pool.map(str::to_string),
                device: device.map(str::to_string),
                message,
            };
            log.1 += 1;
            log.0.push_back(event.clone());
            if log.0.len() > KEEP {
                log.0.pop_front();
            }
            self.append(&mut log, &event);
            event
        };
        log::warn!(
            "tarn: event {} [{:?}] {}: {}",
            event.id,
            event.severity,
            event.kind,
            event.message
        );
        self.dispatch(&event);
    }

    fn append(&self, log: &mut (VecDeque<Event>, u64, usize), event: &Event) {
        let path = self.dir.join("events.jsonl");
        let Ok(line) = serde_json::to_string(event) else {
            return;
        };
        if log.2 + 1 > 2 * KEEP {
            let text: String = log
                .0
                .iter()
                .filter_map(|e| serde_json::to_string(e).ok())
                .map(|l| l + "\n")
                .collect();
            if crate::pools::write_atomically(&path, text.as_bytes(), 0o644).is_ok() {
                log.2 = log.0.len();
            }
            return;
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        match written {
            Ok(()) => log.2 += 1,
            Err(e) => log::warn!("tarn: cannot write {}: {e}", path.display()),
        }
    }

    /// The events after `after`, at most `limit` of the newest, oldest
    /// first.
    pub fn list(&self, after: Option<u64>, limit: usize) -> Vec<Event> {
        let log = lock(&self.log);
        let matching: Vec<&Event> = log
            .0
            .iter()
            .filter(|e| after.is_none_or(|a| e.id > a))
            .collect();
        let skip = matching.len().saturating_sub(limit);
        matching.into_iter().skip(skip).cloned().collect()
    }

    fn save_alerts(&self, list: &[Alert]) -> std::result::Result<(), ApiError> {
        let bytes =
            serde_json::to_vec_pretty(list).map_err(|e| ApiError::internal(e.to_string()))?;
        let path = self.dir.join("alerts.json");
        crate::pools::write_atomically(&path, &bytes, 0o600)
            .map_err(|e| ApiError::io(format!("cannot write {}: {e}", path.display())))
    }

    /// Adds or replaces an alert.
    pub fn alert_add(&self, alert: &Alert) -> std::result::Result<(), ApiError> {
        let mut st = lock(&self.alerts);
        let mut list = st.list.clone();
        list.retain(|a| a.name != alert.name);
        list.push(alert.clone());
        list.sort_by(|a, b| a.name.cmp(&b.name));
        self.save_alerts(&list)?;
        st.list = list;
        Ok(())
    }

    /// Removes an alert.
    pub fn alert_del(&self, name: &str) -> std::result::Result<(), ApiError> {
        let mut st = lock(&self.alerts);
        if !st.list.iter().any(|a| a.name == name) {
            return Err(ApiError::not_found(format!("no alert '{name}'")));
        }
        let list: Vec<Alert> = st.list.iter().filter(|a| a.name != name).cloned().collect();
        self.save_alerts(&list)?;
        st.list = list;
        st.stats.remove(name);
        Ok(())
    }

    /// Every alert, passwords hidden.
    pub fn alert_list(&self) -> Vec<AlertInfo> {
        let st = lock(&self.alerts);
        st.list
            .iter()
            .map(|a| {
                let mut shown = a.clone();
                if let AlertTarget::Email { password, .. } = &mut shown.target {
                    if password.is_some() {
                        *password = Some("*".into());
                    }
                }
                let s = st.stats.get(&a.name).cloned().unwrap_or_default();
                AlertInfo {
                    alert: shown,
                    sent: s.sent,
                    suppressed: s.suppressed,
                    last_error: s.last_error,
                }
            })
            .collect()
    }

    /// Sends a test event through `name` (or every alert) now, whatever
    /// its severity and throttling; answers how each went.
    pub fn alert_test(
        &self,
        name: Option<&str>,
    ) -> std::result::Result<Vec<AlertTestResult>, ApiError> {
        let list: Vec<Alert> = lock(&self.alerts)
            .list
            .iter()
            .filter(|a| name.is_none_or(|n| a.name == n))
            .cloned()
            .collect();
        if list.is_empty() {
            return Err(ApiError::not_found(match name {
                Some(n) => format!("no alert '{n}'"),
                None => "no alerts; add one with `tarn alert add`".to_string(),
            }));
        }
        let event = Event {
            id: 0,
            time_unix: now_unix(),
            severity: Severity::Info,
            kind: "alert.test".into(),
            pool: None,
            device: None,
            message: "a test of tarn's alerts (tarn alert test)".into(),
        };
        let handles: Vec<_> = list
            .into_iter()
            .map(|a| {
                let ev = event.clone();
                std::thread::spawn(move || {
                    let r = deliver(&a, &ev, 0);
                    (a.name, r)
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            if let Ok((name, r)) = h.join() {
                out.push(AlertTestResult {
                    name,
                    error: r.err(),
                });
            }
        }
        Ok(out)
    }

    /// Hands `event` to every alert that wants it, each on its own thread,
    /// throttled.
    fn dispatch(&self, event: &Event) {
        let window = throttle_window();
        let mut jobs = Vec::new();
        {
            let mut st = lock(&self.alerts);
            let list = st.list.clone();
            for a in list {
                if event.severity < a.min_severity {
                    continue;
                }
                let key = (
                    a.name.clone(),
                    event.kind.clone(),
                    event.pool.clone(),
                    event.device.clone(),
                );
                let held = match st.throttle.get_mut(&key) {
                    Some(t) if t.last_sent.elapsed() < window && event.severity <= t.severity => {
                        t.held += 1;
                        t.pending = Some(event.clone());
                        st.stats.entry(a.name.clone()).or_default().suppressed += 1;
                        continue;
                    }
                    Some(t) => {
                        let held = t.held;
                        *t = Throttle::sent(event.severity);
                        held
                    }
                    None => {
                        st.throttle.insert(key, Throttle::sent(event.severity));
                        0
                    }
                };
                jobs.push((a, event.clone(), held));
            }
        }
        self.deliver_all(jobs);
    }

    /// Sends the newest event held back under each key whose window has
    /// ended without another event of the key (called periodically): an
    /// event held back is late, never lost.
    pub fn flush_held(&self) {
        let window = throttle_window();
        let mut jobs = Vec::new();
        {
            let mut st = lock(&self.alerts);
            let list = st.list.clone();
            for (key, t) in st.throttle.iter_mut() {
                if t.pending.is_none() || t.last_sent.elapsed() < window {
                    continue;
                }
                let Some(ev) = t.pending.take() else { continue };
                let others = t.held.saturating_sub(1);
                *t = Throttle::sent(ev.severity);
                if let Some(a) = list.iter().find(|a| a.name == key.0) {
                    jobs.push((a.clone(), ev, others));
                }
            }
        }
        self.deliver_all(jobs);
    }

    /// Delivers each (alert, event, held-back count) on a thread of its
    /// own, at most [`MAX_IN_FLIGHT`] at once per alert.
    fn deliver_all(&self, jobs: Vec<(Alert, Event, u64)>) {
        for (a, event, held) in jobs {
            let name = a.name.clone();
            {
                let mut st = lock(&self.alerts);
                let s = st.stats.entry(name.clone()).or_default();
                if s.in_flight >= MAX_IN_FLIGHT {
                    let why = format!(
                        "{MAX_IN_FLIGHT} deliveries to it are still under way (its endpoint is \
                         slow or does not answer): event {} ({}) was not sent",
                        event.id, event.kind
                    );
                    log::warn!("tarn: alert '{name}': {why}");
                    s.last_error = Some(why);
                    continue;
                }
                s.in_flight += 1;
            }
            let ev = event;
            let alerts = self.alerts.clone();
            let spawned = std::thread::Builder::new()
                .name("tarn-alert".into())
                .spawn(move || {
                    let r = deliver(&a, &ev, held);
                    let mut st = lock(&alerts);
                    let s = st.stats.entry(a.name.clone()).or_default();
                    s.in_flight = s.in_flight.saturating_sub(1);
                    match r {
                        Ok(()) => {
                            s.sent += 1;
                            s.last_error = None;
                        }
                        Err(e) => {
                            log::warn!("tarn: alert '{}' failed: {e}", a.name);
                            s.last_error = Some(e);
                        }
                    }
                });
            if let Err(e) = spawned {
                log::warn!("tarn: cannot start delivering alert '{name}': {e}");
                let mut st = lock(&self.alerts);
                let s = st.stats.entry(name).or_default();
                s.in_flight = s.in_flight.saturating_sub(1);
            }
        }
    }

    /// Looks at every pool and records what changed since the last look
    /// (and sends what throttling held back once its window has passed).
    pub fn observe(&self, pools: &crate::pools::Pools) {
        self.flush_held();
        let Ok(statuses) = pools.pool_status(None) else {
            return;
        };
        let sizes: BTreeMap<String, (u64, u64)> = pools
            .pool_list()
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name, (p.allocated, p.size)))
            .collect();
        let mut seen = lock(&self.seen);
        seen.retain(|name, _| statuses.iter().any(|s| &s.name == name));
        for st in statuses {
            let mut leaves = BTreeMap::new();
            for v in st.vdevs.iter().chain(st.logs.iter()) {
                collect_leaves(v, &mut leaves);
            }
            let (alloc, size) = sizes.get(&st.name).copied().unwrap_or((0, 0));
            let pct = (alloc * 100).checked_div(size).unwrap_or(0);
            let now = Seen {
                health: st.health,
                leaves,
                scan: st.scan.as_ref().map(|s| (s.kind, s.state, s.started_unix)),
                damaged: st.damaged.len(),
                level: 0,
            };
            let previous = seen.get(&st.name).cloned();
            let mut now = now;
            now.level = previous.as_ref().map(|p| p.level).unwrap_or(0);
            self.compare(&st, previous.as_ref(), &mut now, pct);
            seen.insert(st.name.clone(), now);
        }
    }

    fn compare(
        &self,
        st: &tarn_api::pool::PoolStatus,
        before: Option<&Seen>,
        now: &mut Seen,
        pct: u64,
    ) {
        let pool = Some(st.name.as_str());
        let health_event = |h: Health| -> (Severity, String) {
            match h {
                Health::Online => (Severity::Info, "online".into()),
                Health::Degraded => (Severity::Critical, "degraded".into()),
                Health::Faulted => (Severity::Critical, "faulted".into()),
                Health::Offline => (Severity::Warning, "offline".into()),
                Health::Unavail => (Severity::Critical, "unavail".into()),
            }
        };
        // The pool's health.
        let old_health = before.map(|b| b.health).unwrap_or(Health::Online);
        if now.health != old_health {
            let (sev, word) = health_event(now.health);
            let msg = match (&st.message, &st.action) {
                (Some(m), Some(a)) => format!("pool '{}' is {}: {m} {a}", st.name, now.health,),
                (Some(m), None) => format!("pool '{}' is {}: {m}", st.name, now.health),
                _ => format!("pool '{}' is {}", st.name, now.health),
            };
            self.emit(sev, &format!("pool.{word}"), pool, None, msg);
        }
        // Each device.
        for (dev, (h, r, w, c)) in &now.leaves {
            let old = before.and_then(|b| b.leaves.get(dev).copied());
            let old_h = old.map(|o| o.0).unwrap_or(Health::Online);
            if *h != old_h {
                let (sev, word) = health_event(*h);
                self.emit(
                    sev,
                    &format!("device.{word}"),
                    pool,
                    Some(dev),
                    format!("device {dev} of pool '{}' is {h}", st.name),
                );
            }
            // New errors (a first look reports none: they are old).
            if let Some((_, r0, w0, c0)) = old {
                let (dr, dw, dc) = (
                    r.saturating_sub(r0),
                    w.saturating_sub(w0),
                    c.saturating_sub(c0),
                );
                if dr + dw + dc > 0 {
                    self.emit(
                        Severity::Warning,
                        "device.errors",
                        pool,
                        Some(dev),
                        format!(
                            "device {dev} of pool '{}': {dr} new read, {dw} write and {dc} \
                             checksum errors (now {r}, {w}, {c}); tarn repairs what it can from \
                             redundancy",
                            st.name
                        ),
                    );
                }
            }
        }
        // A scan that ended.
        if let (Some((kind, state, started)), Some(b)) = (now.scan, before) {
            let ended = matches!(state, ScanState::Finished | ScanState::Canceled);
            let was_running = match b.scan {
                Some((_, s, t)) => {
                    t != started || !matches!(s, ScanState::Finished | ScanState::Canceled)
                }
                None => true,
            };
            if ended && was_running {
                let scan = st.scan.as_ref();
                let errors = scan.map(|s| s.errors).unwrap_or(0);
                let repaired = scan.map(|s| s.repaired_bytes).unwrap_or(0);
                let what = match kind {
                    ScanKind::Scrub => "scrub",
                    ScanKind::Resilver => "resilver",
                };
                let (sev, how) = if state == ScanState::Canceled {
                    (Severity::Info, "was canceled".to_string())
                } else if errors > 0 {
                    (
                        Severity::Critical,
                        format!("finished with {errors} blocks it could not repair"),
                    )
                } else if repaired > 0 {
                    (
                        Severity::Warning,
                        format!("finished and repaired {repaired} bytes"),
                    )
                } else {
                    (Severity::Info, "finished without errors".to_string())
                };
                self.emit(
                    sev,
                    "scan.finished",
                    pool,
                    None,
                    format!("the {what} of pool '{}' {how}", st.name),
                );
            }
        }
        // Damage.
        let old_damaged = before.map(|b| b.damaged).unwrap_or(0);
        if now.damaged > old_damaged {
            self.emit(
                Severity::Critical,
                "data.damaged",
                pool,
                None,
                format!(
                    "pool '{}' has {} damaged objects that could not be repaired: {}",
                    st.name,
                    now.damaged,
                    st.damaged.join(", ")
                ),
            );
        }
        let (level, tell) = fullness(now.level, pct);
        if let Some(mark) = tell {
            let sev = if mark >= 90 {
                Severity::Critical
            } else {
                Severity::Warning
            };
            self.emit(
                sev,
                "pool.capacity",
                pool,
                None,
                format!(
                    "pool '{}' is {pct} % full; above 90 % writes slow down and space runs out \
                     (destroy snapshots or add devices)",
                    st.name
                ),
            );
        }
        now.level = level;
    }
}

/// The fullness alert after a look at `pct` % full, `level` being the
/// mark last told (0, 80 or 90): the new level, and the mark to tell now
/// if any. Each mark is told once on the way up, and told again only
/// after the pool went five points below it (below 85 for 90, below 75
/// for 80), so a pool hovering at a mark does not raise an event at
/// every crossing.
fn fullness(level: u8, pct: u64) -> (u8, Option<u8>) {
    let mark = if pct >= 90 {
        90
    } else if pct >= 80 {
        80
    } else {
        0
    };
    if mark > level {
        return (mark, Some(mark));
    }
    let level = if pct < 75 {
        0
    } else if level == 90 && pct < 85 {
        80
    } else {
        level
    };
    (level, None)
}

fn collect_leaves(v: &VdevStatus, out: &mut BTreeMap<String, (Health, u64, u64, u64)>) {
    if v.children.is_empty() {
        let c = &v.counters;
        out.insert(
            v.name.clone(),
            (v.health, c.read_errors, c.write_errors, c.cksum_errors),
        );
    }
    for ch in &v.children {
        collect_leaves(ch, out);
    }
}

/// The subject line of an event's mail.
pub fn subject(ev: &Event) -> String {
    let sev = match ev.severity {
        Severity::Info => "info",
        Severity::Warning => "WARNING",
        Severity::Critical => "CRITICAL",
    };
    let about = [ev.pool.as_deref(), ev.device.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "tarn".into());
    format!("[tarn {host}] {sev}: {} {about}", ev.kind)
        .trim_end()
        .to_string()
}

/// The text of an event's mail (and a program's message).
pub fn body(ev: &Event, held: u64) -> String {
    let mut b = format!(
        "{}\n\nwhen: {} UTC\nkind: {}\nseverity: {:?}\n",
        ev.message,
        tarn_api::time::utc_minutes(ev.time_unix),
        ev.kind,
        ev.severity
    );
    if let Some(p) = &ev.pool {
        b.push_str(&format!("pool: {p}\n"));
    }
    if let Some(d) = &ev.device {
        b.push_str(&format!("device: {d}\n"));
    }
    if held > 0 {
        b.push_str(&format!(
            "\n{held} more events like this one were held back since the last one sent.\n"
        ));
    }
    b.push_str("\n`tarn events` lists what happened; `tarn pool status` shows the pools.\n");
    b
}

/// Delivers one event through one alert (retrying a webhook); `held` is
/// how many like it throttling held back.
pub fn deliver(a: &Alert, ev: &Event, held: u64) -> std::result::Result<(), String> {
    match &a.target {
        AlertTarget::Webhook { url } => webhook(url, ev, held),
        AlertTarget::Email {
            smtp,
            from,
            to,
            user,
            password,
            security,
        } => email(
            smtp,
            from,
            to,
            user.as_deref(),
            password.as_deref(),
            *security,
            ev,
            held,
        ),
        AlertTarget::Program { path } => program(path, ev, held),
    }
}

fn payload(ev: &Event, held: u64) -> Vec<u8> {
    let mut v = serde_json::to_value(ev).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("held_back".into(), held.into());
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Splits `http(s)://host[:port]/path?q` into the endpoint and the target
/// (a query straight after the host, `https://host?token=…`, is the
/// target's; a fragment is not sent). Errors never repeat the URL's
/// secret parts: a user and password in it are refused, not echoed.
fn split_url(url: &str) -> std::result::Result<(tarn_s3::http::Endpoint, String), String> {
    let scheme_end = url.find("://").ok_or("no scheme")? + 3;
    let rest = &url[scheme_end..];
    let rest = &rest[..rest.find('#').unwrap_or(rest.len())];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = (&rest[..end], &rest[end..]);
    if authority.contains('@') {
        return Err(
            "a user and password in the URL are not supported: put the token in \
                    its path or query"
                .into(),
        );
    }
    let target = match target.strip_prefix('?') {
        Some(q) => format!("/?{q}"),
        None if target.is_empty() => "/".to_string(),
        None => target.to_string(),
    };
    let endpoint = tarn_s3::http::Endpoint::parse(&format!("{}{authority}", &url[..scheme_end]))
        .map_err(|e| e.to_string())?;
    Ok((endpoint, target))
}

/// A webhook's URL as errors and logs show it: scheme and host only. Its
/// path and query often are the secret (Slack's, Discord's, a bot
/// token), and logs are read by more people than the alert's owner.
fn shown_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return "(a webhook)".into();
    };
    let rest = &url[scheme_end..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let more = if authority.len() < rest.len() {
        "/…"
    } else {
        ""
    };
    format!("{}{host}{more}", &url[..scheme_end])
}

fn webhook(full_url: &str, ev: &Event, held: u64) -> std::result::Result<(), String> {
    let url = shown_url(full_url);
    let (endpoint, target) = split_url(full_url).map_err(|e| format!("webhook {url}: {e}"))?;
    let body = payload(ev, held);
    let mut wait = Duration::from_secs(1);
    let mut last = String::new();
    for attempt in 1..=5 {
        let result = tarn_s3::http::Client::new(endpoint.clone()).and_then(|mut c| {
            c.request(
                "POST",
                &target,
                &[
                    ("host".to_string(), endpoint.host_header()),
                    ("content-type".to_string(), "application/json".to_string()),
                    ("user-agent".to_string(), "tarn".to_string()),
                ],
                &body,
            )
        });
        match result {
            Ok(r) if (200..300).contains(&r.status) => return Ok(()),
            Ok(r) if r.status < 500 && r.status != 429 => {
                return Err(format!(
                    "webhook {url} refused the event: HTTP {}",
                    r.status
                ))
            }
            Ok(r) => last = format!("HTTP {}", r.status),
            Err(e) => last = e.to_string(),
        }
        if attempt < 5 {
            std::thread::sleep(wait);
            wait *= 2;
        }
    }
    Err(format!("webhook {url} failed 5 times, last: {last}"))
}

#[allow(clippy::too_many_arguments)]
fn email(
    smtp: &str,
    from: &str,
    to: &[String],
    user: Option<&str>,
    password: Option<&str>,
    security: SmtpSecurity,
    ev: &Event,
    held: u64,
) -> std::result::Result<(), String> {
    use lettre::message::Mailbox;
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Tls, TlsParameters};
    use lettre::{Message, SmtpTransport, Transport};
    let (host, port) = smtp
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("--smtp {smtp}: use HOST:PORT"))?;
    let mailbox = |s: &str| {
        s.parse::<Mailbox>()
            .map_err(|e| format!("'{s}' is not an email address: {e}"))
    };
    let mut m = Message::builder().from(mailbox(from)?).subject(subject(ev));
    for t in to {
        m = m.to(mailbox(t)?);
    }
    let message = m
        .body(body(ev, held))
        .map_err(|e| format!("cannot build the mail: {e}"))?;
    // An alert stored before `check_alert` refused this is held to it too.
    if tarn_api::events::password_in_clear(smtp, password.is_some(), security) {
        return Err(format!(
            "mail through {smtp}: not sending the password unencrypted; use --security starttls or tls"
        ));
    }
    let tls = match security {
        SmtpSecurity::None => Tls::None,
        SmtpSecurity::Starttls | SmtpSecurity::Tls => {
            let params =
                TlsParameters::new(host.to_string()).map_err(|e| format!("TLS for {host}: {e}"))?;
            if security == SmtpSecurity::Tls {
                Tls::Wrapper(params)
            } else {
                Tls::Required(params)
            }
        }
    };
    let mut builder = SmtpTransport::builder_dangerous(host)
        .port(port)
        .tls(tls)
        .timeout(Some(Duration::from_secs(30)));
    if let (Some(u), Some(p)) = (user, password) {
        builder = builder.credentials(Credentials::new(u.to_string(), p.to_string()));
    }
    builder
        .build()
        .send(&message)
        .map(|_| ())
        .map_err(|e| format!("mail through {smtp}: {e}"))
}

fn program(path: &str, ev: &Event, held: u64) -> std::result::Result<(), String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(path)
        .env("TARN_EVENT_KIND", &ev.kind)
        .env(
            "TARN_EVENT_SEVERITY",
            format!("{:?}", ev.severity).to_lowercase(),
        )
        .env("TARN_EVENT_MESSAGE", &ev.message)
        .env("TARN_EVENT_POOL", ev.pool.as_deref().unwrap_or(""))
        .env("TARN_EVENT_DEVICE", ev.device.as_deref().unwrap_or(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {path}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&payload(ev, held));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("{path} failed: {st}")),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{path} took longer than 30 seconds"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool's fullness over a day of looks: each mark is told on the
    /// way up, not again while the pool hovers at it, and again after it
    /// went five points below.
    #[test]
    fn fullness_is_told_once_per_crossing() {
        let mut level = 0;
        let mut told = Vec::new();
        for pct in [
            10, 79, 80, 79, 80, 81, 89, 90, 89, 90, 91, 89, 86, 90, 84, 89, 90, 76, 80, 74, 80,
        ] {
            let (l, tell) = fullness(level, pct);
            level = l;
            told.extend(tell.map(|m| (pct, m)));
        }
        assert_eq!(told, [(80, 80), (90, 90), (90, 90), (80, 80)]);
    }

    fn alert(url: &str) -> Alert {
        Alert {
            name: "hook".into(),
            target: AlertTarget::Webhook { url: url.into() },
            min_severity: Severity::Warning,
        }
    }

    #[test]
    fn the_log_survives_a_restart_and_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let ev = Events::open(dir.path()).unwrap();
        for i in 0..(2 * KEEP + 5) {
            ev.emit(
                Severity::Info,
                "test.one",
                Some("tank"),
                None,
                format!("n{i}"),
            );
        }
        let last = ev.list(None, 1);
        assert_eq!(last[0].message, format!("n{}", 2 * KEEP + 4));
        assert_eq!(ev.list(None, usize::MAX).len(), KEEP);
        ev.close();
        drop(ev);
        let lines = std::fs::read_to_string(dir.path().join("events.jsonl"))
            .unwrap()
            .lines()
            .count();
        assert!(lines <= 2 * KEEP, "rewritten when it doubles: {lines}");
        // A torn last line (a crash while appending) is skipped.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("events.jsonl"))
            .unwrap();
        f.write_all(b"{\"id\": 99999, \"ti").unwrap();
        let ev = Events::open(dir.path()).unwrap();
        let after = ev.list(Some(last[0].id), 10);
        assert!(after.is_empty(), "clean stop: no crash event: {after:?}");
        ev.emit(Severity::Info, "test.two", None, None, "x".into());
        let l = ev.list(Some(last[0].id), 10);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].id, last[0].id + 1, "ids go on across restarts");
        // Not closed: the next start says the daemon crashed.
        drop(ev);
        let ev = Events::open(dir.path()).unwrap();
        let l = ev.list(None, 1);
        assert_eq!(l[0].kind, "daemon.crashed");
    }

    #[test]
    fn a_webhook_that_never_answers_holds_only_a_few_threads() {
        // A server that accepts connections and never answers.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(Mutex::new(Vec::new()));
        let h = held.clone();
        std::thread::spawn(move || {
            for c in listener.incoming().flatten() {
                lock(&h).push(c);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let ev = Events::open(dir.path()).unwrap();
        ev.alert_add(&alert(&format!("http://127.0.0.1:{port}/x")))
            .unwrap();
        // Twelve kinds of event: none holds another back.
        for i in 0..12 {
            ev.emit(
                Severity::Critical,
                &format!("device.kind{i}"),
                Some("tank"),
                None,
                "x".into(),
            );
        }
        let t0 = Instant::now();
        while lock(&held).len() < MAX_IN_FLIGHT {
            assert!(t0.elapsed() < Duration::from_secs(10), "no delivery came");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(lock(&held).len(), MAX_IN_FLIGHT, "deliveries at once");
        let info = &ev.alert_list()[0];
        let err = info.last_error.clone().unwrap_or_default();
        assert!(err.contains("still under way"), "{err}");
        assert_eq!(
            lock(&ev.alerts).stats.get("hook").map(|s| s.in_flight),
            Some(MAX_IN_FLIGHT)
        );
    }

    #[test]
    fn throttling_holds_back_repeats_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let ev = Events::open(dir.path()).unwrap();
        // An address nothing listens on: deliveries fail quickly (the
        // counters below are about what was attempted, not delivered).
        ev.alert_add(&alert("http://127.0.0.1:9/x")).unwrap();
        for _ in 0..50 {
            ev.emit(
                Severity::Critical,
                "device.faulted",
                Some("tank"),
                Some("/d1"),
                "x".into(),
            );
        }
        ev.emit(
            Severity::Critical,
            "device.faulted",
            Some("tank"),
            Some("/d2"),
            "x".into(),
        );
        ev.emit(
            Severity::Info,
            "scan.finished",
            Some("tank"),
            None,
            "x".into(),
        );
        let info = &ev.alert_list()[0];
        assert_eq!(info.suppressed, 49, "one of 50 goes, 49 wait");
        let st = lock(&ev.alerts);
        assert_eq!(
            st.throttle.len(),
            2,
            "another device is another key; info is below"
        );
    }

    #[test]
    fn an_escalation_is_not_held_back_and_what_is_held_is_sent_later() {
        let dir = tempfile::tempdir().unwrap();
        let ev = Events::open(dir.path()).unwrap();
        ev.alert_add(&alert("http://127.0.0.1:9/x")).unwrap();
        let emit = |sev: Severity| {
            ev.emit(sev, "pool.capacity", Some("tank"), None, "x".into());
        };
        emit(Severity::Warning);
        emit(Severity::Critical);
        assert_eq!(
            ev.alert_list()[0].suppressed,
            0,
            "90 % after 80 % goes at once"
        );
        emit(Severity::Critical);
        emit(Severity::Warning);
        assert_eq!(ev.alert_list()[0].suppressed, 2);
        // The window ends with nothing more of the kind: the newest held
        // event goes then.
        {
            let mut st = lock(&ev.alerts);
            for t in st.throttle.values_mut() {
                t.last_sent = Instant::now()
                    .checked_sub(throttle_window() + Duration::from_secs(1))
                    .unwrap_or(t.last_sent);
            }
        }
        ev.flush_held();
        let st = lock(&ev.alerts);
        let t = st.throttle.values().next().unwrap();
        assert!(t.pending.is_none() && t.held == 0, "sent, not held");
        assert!(t.last_sent.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn webhook_secrets_stay_out_of_errors() {
        assert_eq!(
            shown_url("https://hooks.slack.com/services/T000/B000/XXXXSECRET"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            shown_url("https://bob:pw@ntfy.example.org:8443?auth=SECRET"),
            "https://ntfy.example.org:8443/…"
        );
        assert_eq!(shown_url("http://10.0.0.5:9000"), "http://10.0.0.5:9000");
        // A hook that refuses: the error names the host, not the path.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 4096];
                let _ = std::io::Read::read(&mut s, &mut buf);
                let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            }
        });
        let e = webhook(
            &format!("http://127.0.0.1:{port}/bot123456:SECRET-TOKEN/send"),
            &Event {
                id: 0,
                time_unix: 0,
                severity: Severity::Info,
                kind: "test".into(),
                pool: None,
                device: None,
                message: "x".into(),
            },
            0,
        );
        let e = e.unwrap_err();
        assert!(!e.contains("SECRET"), "{e}");
        assert!(e.contains("HTTP 404") && e.contains("127.0.0.1"), "{e}");
        // A query straight after the host, and a user and password (which
        // are refused), never reach an error either.
        let (ep, target) = split_url("https://ntfy.example.org:8443?auth=SECRET").unwrap();
        assert_eq!(target, "/?auth=SECRET");
        assert!(!format!("{ep:?}").contains("SECRET"), "{ep:?}");
        for url in [
            "https://bob:pw-SECRET@ntfy.example.org:8443?auth=SECRET",
            "https://TOKEN-SECRET@hooks.example.org/x",
        ] {
            let e = split_url(url).expect_err("refused");
            assert!(!e.contains("SECRET"), "{e}");
        }
    }

    /// An email alert through `smtp` with a login.
    fn mail_with_password(smtp: &str, security: SmtpSecurity) -> Alert {
        Alert {
            name: "mail".into(),
            target: AlertTarget::Email {
                smtp: smtp.into(),
                from: "nas@example.org".into(),
                to: vec!["me@example.org".into()],
                user: Some("nas".into()),
                password: Some("s3cret-pass".into()),
                security,
            },
            min_severity: Severity::Warning,
        }
    }

    #[test]
    fn passwords_are_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let ev = Events::open(dir.path()).unwrap();
        ev.alert_add(&mail_with_password(
            "mail.example.org:587",
            SmtpSecurity::Starttls,
        ))
        .unwrap();
        let shown = serde_json::to_string(&ev.alert_list()).unwrap();
        assert!(!shown.contains("s3cret-pass"), "{shown}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("alerts.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_stored_password_is_not_mailed_unencrypted_off_the_machine() {
        // As an alerts.json from before `check_alert` refused it could
        // hold it: the address is one nothing answers on (TEST-NET-1), so
        // without the refusal this would fail differently, after trying.
        let mail = mail_with_password("192.0.2.1:25", SmtpSecurity::None);
        let ev = Event {
            id: 1,
            time_unix: 0,
            severity: Severity::Critical,
            kind: "alert.test".into(),
            pool: None,
            device: None,
            message: "test".into(),
        };
        let e = deliver(&mail, &ev, 0).expect_err("refused");
        assert!(e.contains("unencrypted"), "{e}");
    }

    #[test]
    fn urls_split_into_endpoint_and_target() {
        let (e, t) = split_url("https://hooks.example.org:8443/a/b?c=d").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.tls),
            ("hooks.example.org", 8443, true)
        );
        assert_eq!(t, "/a/b?c=d");
        let (e, t) = split_url("http://127.0.0.1").unwrap();
        assert_eq!((e.port, t.as_str()), (80, "/"));
        assert!(split_url("hooks.example.org/x").is_err());
    }
}
