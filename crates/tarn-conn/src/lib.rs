//! Connection admission shared by tarn's network servers (NFS, WebDAV).
//!
//! tarn listens on home and office networks and, through WebDAV, on the
//! internet, so one client must not be able to lock the others out by
//! holding connections open. [`Admission`] decides, at accept time, who
//! gets a connection slot:
//!
//! - an address that already holds [`Limits::max_per_address`]
//!   connections is refused (its own connections are its own business;
//!   nobody else's slots are touched);
//! - when all [`Limits::max_connections`] slots are taken, an *idle*
//!   connection is closed to make room: one of the address holding the
//!   most connections, the longest idle of those. So a newcomer is
//!   refused only when every connection is busy, and a flood from a few
//!   addresses pushes out its own connections before anyone else's.
//!
//! "Idle" is defined by the server, not by bytes on the wire: a
//! connection is busy while it holds a [`Busy`] guard (NFS: a request
//! decoded and not yet answered; WebDAV: a request being served), and its
//! idle time counts from the end of its last request. A client that
//! trickles a partial request is therefore idle, however many bytes it
//! sends.
//!
//! Every decision is counted ([`Stats`]) and logged on stderr through a
//! [`RateLog`], which prints at most one line per kind of event per
//! interval, so a flood of refused connections cannot flood the log.
//!
//! The servers that check passwords also share their failed-login
//! accounting here ([`LoginLimiter`]), so WebDAV and the web API count
//! and bound it the same way.

#![warn(missing_docs)]

mod host;
mod login;
mod net;
mod progress;

pub use host::{keepalive, Host, HostConfig};
pub use login::{Attempt, LoginLimiter, LOGIN_CLIENTS_MAX, PASSWORD_CHECKS_AT_ONCE};
pub use net::{client_key, IpNet, IpNetError};
pub use progress::{Progress, ProgressClock, STALL_IDLE};

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Connection limits of one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once, over all clients (at least 1).
    pub max_connections: usize,
    /// Most connections open at once from one IP address (at least 1).
    pub max_per_address: usize,
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The address already holds `max_per_address` connections.
    PerAddress,
    /// Every slot is taken and no connection is idle.
    Full,
}

/// Counters of admission decisions since the server started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections open now.
    pub open: u64,
    /// Connections admitted.
    pub accepted: u64,
    /// Refused: the address was at its per-address limit.
    pub refused_per_address: u64,
    /// Refused: every slot was taken by a busy connection.
    pub refused_full: u64,
    /// Refused: the address may not use the service at all (NFS: no
    /// export lists it).
    pub refused_unlisted: u64,
    /// Idle connections closed to make room for a newcomer.
    pub evicted: u64,
    /// Connections closed by the server's idle timeout.
    pub idle_closed: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    refused_per_address: AtomicU64,
    refused_full: AtomicU64,
    refused_unlisted: AtomicU64,
    evicted: AtomicU64,
    idle_closed: AtomicU64,
}

struct Slot {
    ip: IpAddr,
    state: Arc<ConnState>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    slots: HashMap<u64, Slot>,
    per_addr: HashMap<IpAddr, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Slot> {
        let slot = self.slots.remove(&id)?;
        if let Some(n) = self.per_addr.get_mut(&slot.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_addr.remove(&slot.ip);
            }
        }
        Some(slot)
    }
}

/// The admission table of one server (see the crate docs).
pub struct Admission {
    limits: Limits,
    table: Mutex<Table>,
    counters: Counters,
    log: RateLog,
    epoch: Instant,
}

impl Admission {
    /// A table enforcing `limits`; log lines start with `name`
    /// (e.g. `tarn-nfs`).
    pub fn new(name: &'static str, limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits: Limits {
                max_connections: limits.max_connections.max(1),
                max_per_address: limits.max_per_address.max(1),
            },
            table: Mutex::new(Table::default()),
            counters: Counters::default(),
            log: RateLog::new(name, Duration::from_secs(10)),
            epoch: Instant::now(),
        })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `ip`, closing an idle connection if every
    /// slot is taken (see the crate docs); or refuses it (counted and
    /// logged).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Conn, Refused> {
        let ip = ip.to_canonical();
        let mut t = self.table();
        let from_ip = t.per_addr.get(&ip).copied().unwrap_or(0);
        if from_ip >= self.limits.max_per_address {
            drop(t);
            self.counters
                .refused_per_address
                .fetch_add(1, Ordering::Relaxed);
            self.log.log(
                "per-address",
                &format!(
                    "refused a connection from {ip}: it already holds {} connections (the per-address limit)",
                    self.limits.max_per_address
                ),
            );
            return Err(Refused::PerAddress);
        }
        if t.slots.len() >= self.limits.max_connections {
            // The idle connection of the address holding the most
            // connections, the longest idle of those: a flood from a few
            // addresses evicts its own connections first.
            let victim = t
                .slots
                .iter()
                .filter_map(|(id, s)| {
                    let held = t.per_addr.get(&s.ip).copied().unwrap_or(0);
                    s.state.idle_ms().map(|idle| (held, idle, *id))
                })
                .max();
            let Some((_, _, id)) = victim else {
                drop(t);
                self.counters.refused_full.fetch_add(1, Ordering::Relaxed);
                self.log.log(
                    "full",
                    &format!(
                        "refused a connection from {ip}: all {} connections are busy",
                        self.limits.max_connections
                    ),
                );
                return Err(Refused::Full);
            };
            if let Some(slot) = t.remove(id) {
                slot.state.close();
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
                self.log.log(
                    "evicted",
                    &format!(
                        "connection limit ({}) reached: closed an idle connection from {} for a newcomer from {ip}",
                        self.limits.max_connections, slot.ip
                    ),
                );
            }
        }
        let id = t.next_id;
        t.next_id += 1;
        let state = Arc::new(ConnState {
            busy: AtomicUsize::new(0),
            stalled_since: AtomicU64::new(0),
            last: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            notify: Notify::new(),
            epoch: self.epoch,
        });
        state.touch();
        t.slots.insert(
            id,
            Slot {
                ip,
                state: state.clone(),
            },
        );
        *t.per_addr.entry(ip).or_insert(0) += 1;
        drop(t);
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(Conn {
            admission: self.clone(),
            id,
            ip,
            state,
        })
    }

    /// Counts (and logs, rate-limited) a connection refused before
    /// admission because `ip` may not use the service at all; it takes
    /// no slot.
    pub fn refuse_unlisted(&self, ip: IpAddr, why: &str) {
        self.counters
            .refused_unlisted
            .fetch_add(1, Ordering::Relaxed);
        self.log.log(
            "unlisted",
            &format!("refused a connection from {}: {why}", ip.to_canonical()),
        );
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            open: self.table().slots.len() as u64,
            accepted: c.accepted.load(Ordering::Relaxed),
            refused_per_address: c.refused_per_address.load(Ordering::Relaxed),
            refused_full: c.refused_full.load(Ordering::Relaxed),
            refused_unlisted: c.refused_unlisted.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            idle_closed: c.idle_closed.load(Ordering::Relaxed),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}

/// An admitted connection's slot; dropping it frees the slot.
pub struct Conn {
    admission: Arc<Admission>,
    id: u64,
    ip: IpAddr,
    state: Arc<ConnState>,
}

impl Conn {
    /// The connection's activity record, to share with its tasks.
    pub fn state(&self) -> &Arc<ConnState> {
        &self.state
    }

    /// The client's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// Resolves when the connection should be closed: evicted for a
    /// newcomer, closed through [`ConnState::close`], or idle (no
    /// [`Busy`] guard) for `idle_timeout` (`None`: no idle timeout). An
    /// idle close is counted.
    pub async fn closed(&self, idle_timeout: Option<Duration>) {
        let st = &self.state;
        loop {
            if st.is_closing() {
                return;
            }
            let wait = match idle_timeout {
                None => None,
                Some(limit) => match st.idle_ms() {
                    Some(idle) if Duration::from_millis(idle) >= limit => {
                        self.admission
                            .counters
                            .idle_closed
                            .fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Some(idle) => Some(limit - Duration::from_millis(idle)),
                    // Busy: look again later.
                    None => Some((limit / 4).max(Duration::from_millis(10))),
                },
            };
            let notified = st.notify.notified();
            match wait {
                Some(d) => {
                    let _ = tokio::time::timeout(d, notified).await;
                }
                None => notified.await,
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.admission.table().remove(self.id);
    }
}

/// What the server knows of a connection's activity.
pub struct ConnState {
    busy: AtomicUsize,
    /// Milliseconds since the epoch, plus one, when a busy connection's
    /// client stopped taking its answer ([`ConnState::set_stalled`]); 0
    /// while it takes it.
    stalled_since: AtomicU64,
    /// Milliseconds since the admission table's epoch at the end of the
    /// last request (or at admission).
    last: AtomicU64,
    closing: AtomicBool,
    notify: Notify,
    epoch: Instant,
}

impl ConnState {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn touch(&self) {
        self.last.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Marks the start of a request; the connection is busy (not idle,
    /// never evicted) until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.touch();
        Busy(self.clone())
    }

    /// Milliseconds since the last request ended; None while busy. A
    /// busy connection whose client has stopped taking its answer
    /// ([`ConnState::set_stalled`]) counts as idle since it stopped: it
    /// serves nobody, so it may be evicted or closed for idleness.
    pub fn idle_ms(&self) -> Option<u64> {
        if self.busy.load(Ordering::Acquire) > 0 {
            let since = self.stalled_since.load(Ordering::Acquire);
            return (since > 0).then(|| self.now_ms().saturating_sub(since - 1));
        }
        Some(
            self.now_ms()
                .saturating_sub(self.last.load(Ordering::Relaxed)),
        )
    }

    /// Notes whether the client has stopped taking what the connection
    /// sends it (a download it no longer reads): from then on the
    /// connection counts as idle though a request is running.
    pub fn set_stalled(&self, stalled: bool) {
        let now = self.now_ms() + 1;
        if stalled {
            let _ =
                self.stalled_since
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        } else {
            self.stalled_since.store(0, Ordering::Release);
        }
    }

    /// Counts the connection idle while `work` runs, though a request is
    /// running (a [`Busy`] guard is held): for a request whose small body
    /// a client may trickle (a login), so that holding a connection with
    /// a slow body does not make it one that cannot be evicted.
    pub async fn idle_during<F: std::future::Future>(self: &Arc<Self>, work: F) -> F::Output {
        struct Again<'a>(&'a ConnState);
        impl Drop for Again<'_> {
            fn drop(&mut self) {
                self.0.busy.fetch_add(1, Ordering::AcqRel);
            }
        }
        if self.busy.load(Ordering::Acquire) == 0 {
            return work.await;
        }
        self.touch();
        self.busy.fetch_sub(1, Ordering::AcqRel);
        let _again = Again(self);
        work.await
    }

    /// Asks the connection to close ([`Conn::closed`] resolves).
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// True once the connection was asked to close.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// A request in progress on a connection (see [`ConnState::begin`]).
pub struct Busy(Arc<ConnState>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Log lines on stderr, at most one per kind per interval; the next line
/// of a kind says how many were left out.
pub struct RateLog {
    name: &'static str,
    interval: Duration,
    state: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl RateLog {
    /// Lines prefixed with `name: `, one per kind per `interval`.
    pub fn new(name: &'static str, interval: Duration) -> RateLog {
        RateLog {
            name,
            interval,
            state: Mutex::new(HashMap::new()),
        }
    }

    /// Logs `msg` unless a line of `kind` went out less than an interval
    /// ago; returns true if it was printed.
    pub fn log(&self, kind: &'static str, msg: &str) -> bool {
        let now = Instant::now();
        let suppressed = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            match st.get_mut(kind) {
                Some((last, n)) if now.duration_since(*last) < self.interval => {
                    *n += 1;
                    return false;
                }
                Some((last, n)) => {
                    *last = now;
                    std::mem::take(n)
                }
                None => {
                    st.insert(kind, (now, 0));
                    0
                }
            }
        };
        if suppressed > 0 {
            log::warn!("{}: {msg} ({suppressed} similar lines left out)", self.name);
        } else {
            log::warn!("{}: {msg}", self.name);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn per_address_limit_refuses_only_that_address() {
        let a = Admission::new(
            "test",
            Limits {
                max_connections: 10,
                max_per_address: 2,
            },
        );
        let c1 = a.admit(ip(2)).unwrap();
        let _c2 = a.admit(ip(2)).unwrap();
        assert_eq!(a.admit(ip(2)).err(), Some(Refused::PerAddress));
        let _other = a.admit(ip(3)).unwrap();
        // IPv4-mapped IPv6 is the same client.
        assert_eq!(
            a.admit("::ffff:127.0.0.2".parse().unwrap()).err(),
            Some(Refused::PerAddress)
        );
        drop(c1);
        assert!(a.admit(ip(2)).is_ok(), "a freed slot is reusable");
        let s = a.stats();
        assert_eq!((s.refused_per_address, s.accepted), (2, 4));
    }

    #[test]
    fn full_table_evicts_the_longest_idle_never_a_busy_one() {
        let a = Admission::new(
            "test",
            Limits {
                max_connections: 3,
                max_per_address: 3,
            },
        );
        let old = a.admit(ip(2)).unwrap();
        let busy = a.admit(ip(3)).unwrap();
        let _guard = busy.state().begin();
        std::thread::sleep(Duration::from_millis(20));
        let young = a.admit(ip(4)).unwrap();
        let _new = a.admit(ip(5)).unwrap();
        assert!(old.state().is_closing(), "longest idle closed");
        assert!(!busy.state().is_closing() && !young.state().is_closing());
        assert_eq!(a.stats().evicted, 1);
        assert_eq!(a.stats().open, 3);
        // Everyone busy: the newcomer is refused.
        let _g2 = young.state().begin();
        let _g3 = _new.state().begin();
        assert_eq!(a.admit(ip(6)).err(), Some(Refused::Full));
        assert_eq!(a.stats().refused_full, 1);
        // The evicted connection's own drop does not free another slot.
        drop(old);
        assert_eq!(a.stats().open, 3);
    }

    #[test]
    fn eviction_hits_the_address_holding_most_connections() {
        let a = Admission::new(
            "test",
            Limits {
                max_connections: 4,
                max_per_address: 4,
            },
        );
        let lone = a.admit(ip(2)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let flood: Vec<Conn> = (0..3).map(|_| a.admit(ip(3)).unwrap()).collect();
        let _new = a.admit(ip(4)).unwrap();
        assert!(
            !lone.state().is_closing(),
            "the longer-idle lone client stays"
        );
        assert_eq!(flood.iter().filter(|c| c.state().is_closing()).count(), 1);
    }

    #[test]
    fn idle_timeout_spares_busy_connections() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let a = Admission::new(
            "test",
            Limits {
                max_connections: 4,
                max_per_address: 4,
            },
        );
        rt.block_on(async {
            let c = a.admit(ip(2)).unwrap();
            let guard = c.state().begin();
            let t = Duration::from_millis(50);
            let r = tokio::time::timeout(Duration::from_millis(300), c.closed(Some(t))).await;
            assert!(r.is_err(), "busy connection not closed");
            drop(guard);
            let r = tokio::time::timeout(Duration::from_millis(1000), c.closed(Some(t))).await;
            assert!(r.is_ok(), "idle connection closed");
            assert_eq!(a.stats().idle_closed, 1);
            let c2 = a.admit(ip(3)).unwrap();
            c2.state().close();
            c2.closed(None).await;
        });
    }

    /// A busy connection is never evicted, except while it waits for a
    /// small body (`idle_during`) or its client has stopped taking its
    /// answer (`set_stalled`): then it is as idle as any other.
    #[test]
    fn a_stalled_or_waiting_busy_connection_may_be_evicted() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let limits = Limits {
            max_connections: 1,
            max_per_address: 1,
        };
        let a = Admission::new("test", limits);
        let c = a.admit(ip(2)).unwrap();
        let _busy = c.state().begin();
        assert_eq!(a.admit(ip(3)).err(), Some(Refused::Full));
        c.state().set_stalled(true);
        assert!(c.state().idle_ms().is_some());
        c.state().set_stalled(false);
        assert_eq!(c.state().idle_ms(), None, "taking its answer again");
        c.state().set_stalled(true);
        let _new = a.admit(ip(3)).expect("the stalled connection made room");
        assert!(c.state().is_closing());

        let a = Admission::new("test", limits);
        let c = Arc::new(a.admit(ip(2)).unwrap());
        let _busy = c.state().begin();
        let (a2, c2) = (a.clone(), c.clone());
        let evicted = rt.block_on(c.state().idle_during(async move {
            let newcomer = a2.admit(ip(3));
            (newcomer.is_ok(), c2.state().is_closing())
        }));
        assert_eq!(evicted, (true, true), "waiting for its body, it was idle");
        assert_eq!(c.state().idle_ms(), None, "busy again after the body");
    }

    #[test]
    fn rate_log_prints_one_line_per_interval() {
        let l = RateLog::new("test", Duration::from_secs(3600));
        assert!(l.log("k", "first"));
        assert!(!l.log("k", "second"));
        assert!(l.log("other", "another kind"));
    }
}
