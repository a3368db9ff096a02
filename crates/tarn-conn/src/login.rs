//! Failed-login accounting for the servers that check passwords (WebDAV,
//! the web API): after `max` attempts that did not succeed within
//! `window`, a client is refused until the oldest of them is older than
//! the window.
//!
//! Three rules, each closing a way around the count:
//!
//! - **An attempt counts before its password is checked**
//!   ([`LoginLimiter::attempt`]), and a success takes back only its own
//!   attempt ([`LoginLimiter::succeeded`]). Counting failures after the
//!   check let a client start many checks at once (one per connection),
//!   all passing the count before any failed; and clearing a client's
//!   record on any success let someone who knows one password log in
//!   with it between guesses at other accounts, forever.
//! - **A client is an address, or an IPv6 /64** ([`crate::client_key`]):
//!   one host usually holds a whole /64.
//! - **The table is bounded and fails closed.** It keeps at most `cap`
//!   clients. When it is full of clients with attempts inside the window,
//!   a client it does not know is refused for a window, rather than its
//!   attempts going uncounted. Expired clients are swept when it is full,
//!   at most once a second, so a stream of new addresses does not make
//!   every attempt a sweep of the whole table. Filling it takes `cap`
//!   distinct clients each attempting within one window. The servers
//!   count an attempt only once a password check has its slot
//!   ([`PASSWORD_CHECKS_AT_ONCE`] at a time), just before its slow hash
//!   runs, and do not count requests that carry no password to check
//!   (none, or a malformed header): every entry costs the attacker a
//!   hash's wait.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Password checks a server runs at once: each is a deliberately slow
/// hash, and a flood of them must not take every core and the memory the
/// hashes use.
pub const PASSWORD_CHECKS_AT_ONCE: usize = 4;

/// Clients a [`LoginLimiter`] keeps by default.
pub const LOGIN_CLIENTS_MAX: usize = 65_536;

/// Counts login attempts per client (see the module docs).
pub struct LoginLimiter {
    max: usize,
    window: Duration,
    cap: usize,
    sweep_every: Duration,
    state: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    clients: HashMap<IpAddr, VecDeque<Instant>>,
    swept: Option<Instant>,
}

/// One counted attempt, to hand back to [`LoginLimiter::succeeded`] if
/// the password was right.
#[derive(Debug)]
pub struct Attempt {
    key: IpAddr,
    at: Instant,
}

impl LoginLimiter {
    /// A limiter refusing a client after `max` (at least 1) attempts that
    /// did not succeed within `window`, keeping [`LOGIN_CLIENTS_MAX`]
    /// clients.
    pub fn new(max: u32, window: Duration) -> LoginLimiter {
        LoginLimiter {
            max: max.max(1) as usize,
            window,
            cap: LOGIN_CLIENTS_MAX,
            sweep_every: Duration::from_secs(1),
            state: Mutex::new(Table::default()),
        }
    }

    /// The same, keeping at most `cap` clients and sweeping a full table
    /// at most every `sweep_every` (for tests of a full table).
    pub fn with_cap(mut self, cap: usize, sweep_every: Duration) -> LoginLimiter {
        self.cap = cap.max(1);
        self.sweep_every = sweep_every;
        self
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `q`'s client must wait, if it has used its attempts.
    fn wait(&self, q: &mut VecDeque<Instant>, now: Instant) -> Option<Duration> {
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.window)
        {
            q.pop_front();
        }
        if q.len() < self.max {
            return None;
        }
        let oldest = q.front().copied().unwrap_or(now);
        Some(self.window.saturating_sub(now.duration_since(oldest)))
    }

    /// If `ip` has used its attempts: how long until it may try again.
    /// Counts nothing (for a request that may not even need a password).
    pub fn blocked(&self, ip: IpAddr) -> Option<Duration> {
        let key = crate::client_key(ip);
        let now = Instant::now();
        let mut t = self.table();
        let q = t.clients.get_mut(&key)?;
        let wait = self.wait(q, now);
        if q.is_empty() {
            t.clients.remove(&key);
        }
        wait
    }

    /// Counts an attempt of `ip` before its password is checked; Err with
    /// how long to wait if it may not try now.
    pub fn attempt(&self, ip: IpAddr) -> Result<Attempt, Duration> {
        let key = crate::client_key(ip);
        let now = Instant::now();
        let mut t = self.table();
        if !t.clients.contains_key(&key) && t.clients.len() >= self.cap {
            if t.swept
                .is_none_or(|s| now.duration_since(s) >= self.sweep_every)
            {
                t.swept = Some(now);
                let window = self.window;
                t.clients
                    .retain(|_, q| q.back().is_some_and(|at| now.duration_since(*at) < window));
            }
            if t.clients.len() >= self.cap {
                // Full of live clients: a newcomer waits, rather than its
                // attempts going uncounted.
                return Err(self.window);
            }
        }
        let q = t.clients.entry(key).or_default();
        if let Some(wait) = self.wait(q, now) {
            return Err(wait);
        }
        q.push_back(now);
        Ok(Attempt { key, at: now })
    }

    /// The password of `a` was right: that attempt does not count. The
    /// client's other attempts still do.
    pub fn succeeded(&self, a: Attempt) {
        let mut t = self.table();
        if let Some(q) = t.clients.get_mut(&a.key) {
            if let Some(i) = q.iter().position(|at| *at == a.at) {
                q.remove(i);
            }
            if q.is_empty() {
                t.clients.remove(&a.key);
            }
        }
    }

    /// Clients with attempts recorded (expired ones included until they
    /// are looked at or swept).
    pub fn clients(&self) -> usize {
        self.table().clients.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn attempts_count_before_the_check_and_a_success_takes_back_only_its_own() {
        let l = LoginLimiter::new(3, Duration::from_secs(60));
        let a = ip("192.0.2.1");
        // Three checks started at once use the budget: a fourth waits,
        // whatever the three turn out to be.
        let first = l.attempt(a).unwrap();
        let _second = l.attempt(a).unwrap();
        let _third = l.attempt(a).unwrap();
        assert!(l.attempt(a).is_err());
        assert!(l.blocked(a).is_some());
        // One was right: one more may try, not three more.
        l.succeeded(first);
        assert!(l.blocked(a).is_none());
        let right = l.attempt(a).unwrap();
        assert!(l.attempt(a).is_err());
        l.succeeded(right);
        // Another client is not affected; an IPv6 /64 is one client.
        assert!(l.attempt(ip("192.0.2.2")).is_ok());
        for host in 1..=3 {
            l.attempt(ip(&format!("2001:db8:1:2::{host}"))).unwrap();
        }
        assert!(l.attempt(ip("2001:db8:1:2:ffff::9")).is_err());
        assert!(l.attempt(ip("2001:db8:1:3::1")).is_ok());
    }

    #[test]
    fn the_window_expires() {
        let l = LoginLimiter::new(1, Duration::from_millis(50));
        let a = ip("192.0.2.1");
        l.attempt(a).unwrap();
        let wait = l.attempt(a).unwrap_err();
        assert!(wait <= Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(60));
        assert!(l.blocked(a).is_none());
        assert!(l.attempt(a).is_ok());
    }

    #[test]
    fn a_full_table_refuses_newcomers_and_sweeps_expired_clients() {
        let l = LoginLimiter::new(5, Duration::from_millis(100)).with_cap(2, Duration::ZERO);
        l.attempt(ip("192.0.2.1")).unwrap();
        l.attempt(ip("192.0.2.2")).unwrap();
        // Full of live clients: a newcomer waits; the known ones go on.
        assert_eq!(
            l.attempt(ip("192.0.2.3")).unwrap_err(),
            Duration::from_millis(100)
        );
        assert!(l.attempt(ip("192.0.2.1")).is_ok());
        assert_eq!(l.clients(), 2);
        // Once theirs expire, the sweep makes room.
        std::thread::sleep(Duration::from_millis(120));
        assert!(l.attempt(ip("192.0.2.3")).is_ok());
        assert_eq!(l.clients(), 1);
    }

    #[test]
    fn a_full_table_is_swept_at_most_so_often() {
        let l =
            LoginLimiter::new(5, Duration::from_millis(20)).with_cap(1, Duration::from_secs(60));
        l.attempt(ip("192.0.2.1")).unwrap();
        // The first newcomer sweeps (nothing expired yet) ...
        assert!(l.attempt(ip("192.0.2.2")).is_err());
        std::thread::sleep(Duration::from_millis(30));
        // ... and the next one within the interval does not, even though
        // the table now holds only an expired client.
        assert!(l.attempt(ip("192.0.2.3")).is_err());
        assert_eq!(l.clients(), 1);
    }
}
