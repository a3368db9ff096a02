//! Authentication: HTTP Basic credentials checked by a pluggable
//! [`Authenticator`], and a short-lived cache of successful checks. Failed
//! logins are counted by the limiter the servers share
//! ([`tarn_conn::LoginLimiter`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tarn_fs::Cred;

/// Who a request runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// User name: the owner of the locks it takes, and what logs show.
    pub name: String,
    /// Filesystem user id every operation runs with.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// False: every modifying request (PUT, DELETE, MKCOL, COPY, MOVE,
    /// PROPPATCH, LOCK, ...) is refused with 403.
    pub can_write: bool,
}

impl Principal {
    /// The filesystem credential of this principal.
    pub fn cred(&self) -> Cred {
        Cred {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Checks user names and passwords. Implementations may block (e.g. hash a
/// password with argon2): the server calls them on its blocking pool.
pub trait Authenticator: Send + Sync + 'static {
    /// The principal for these credentials, or None if they are wrong.
    fn check(&self, user: &str, password: &str) -> Option<Principal>;
    /// [`Authenticator::check`] for a request to a share of `realm`
    /// ([`crate::Share::realm`]): only a user defined there. The default
    /// ignores the realm.
    fn check_in(&self, realm: Option<&str>, user: &str, password: &str) -> Option<Principal> {
        let _ = realm;
        self.check(user, password)
    }
    /// The principal of a request without credentials; None (the default)
    /// answers such requests with 401.
    fn anonymous(&self) -> Option<Principal> {
        None
    }
}

/// A fixed table of users and plain-text passwords (tests, simple setups).
#[derive(Default)]
pub struct StaticUsers {
    users: HashMap<String, (String, Principal)>,
}

impl StaticUsers {
    /// An empty table.
    pub fn new() -> StaticUsers {
        StaticUsers::default()
    }
    /// Adds (or replaces) a user; `principal.name` is set to `user`.
    pub fn with_user(mut self, user: &str, password: &str, mut principal: Principal) -> Self {
        principal.name = user.to_string();
        self.users
            .insert(user.to_string(), (password.to_string(), principal));
        self
    }
}

/// Compares without an early exit, so timing does not reveal how much of
/// a password matched.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

impl Authenticator for StaticUsers {
    fn check(&self, user: &str, password: &str) -> Option<Principal> {
        let (pw, p) = self.users.get(user)?;
        ct_eq(pw.as_bytes(), password.as_bytes()).then(|| p.clone())
    }
}

/// Everyone, with or without credentials, is the given principal. For tests
/// and trusted loopback setups only.
pub struct Anonymous(pub Principal);

impl Authenticator for Anonymous {
    fn check(&self, _user: &str, _password: &str) -> Option<Principal> {
        Some(self.0.clone())
    }
    fn anonymous(&self) -> Option<Principal> {
        Some(self.0.clone())
    }
}

/// Decodes standard base64 (with or without padding); None if invalid.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.trim_end_matches('=').as_bytes();
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Parses an `Authorization: Basic ...` value into (user, password).
pub(crate) fn parse_basic(header: &str) -> Option<(String, String)> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64_decode(rest.trim())?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// The outcome of one password check that requests wait for: the
/// principal (None: wrong), or how long the client must wait before it
/// may try (its attempts are used up).
pub(crate) type Checked = Result<Option<Principal>, std::time::Duration>;

/// Password checks in flight, by credentials and client: a request that
/// brings the same credentials from the same client while they are being
/// checked waits for that check instead of starting (and counting) its
/// own. A client sends its credentials with every request; when the
/// login cache has expired, a burst of parallel requests (a file manager
/// opening a folder) would otherwise count one attempt each and meet 429
/// with the right password. Different passwords are different entries,
/// so guesses still count one each.
#[derive(Default)]
pub(crate) struct InFlight {
    map: Mutex<HashMap<[u8; 32], Arc<tokio::sync::OnceCell<Checked>>>>,
}

impl InFlight {
    /// The outcome of checking these credentials for client `client`
    /// ([`tarn_conn::client_key`]): `run`'s, or that of the same check
    /// already running. If the request running it goes away before it
    /// ends, a waiting one runs it instead.
    pub(crate) async fn check<F, Fut>(
        &self,
        realm: Option<&str>,
        user: &str,
        password: &str,
        client: std::net::IpAddr,
        run: F,
    ) -> Checked
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Checked>,
    {
        let mut h = blake3::Hasher::new();
        h.update(&AuthCache::key(realm, user, password));
        h.update(client.to_string().as_bytes());
        let key = *h.finalize().as_bytes();
        let cell = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(key).or_default().clone()
        };
        let waiting = Waiting {
            map: &self.map,
            key,
            cell,
        };
        waiting.cell.get_or_init(run).await.clone()
    }

    /// Checks in flight now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A request's share of a check in flight. Dropped (the check done, or
/// the request gone), it removes the entry once the check is over, or
/// when nobody else waits for it: a request that goes away before its
/// check started must not leave an entry behind for ever.
struct Waiting<'a> {
    map: &'a Mutex<HashMap<[u8; 32], Arc<tokio::sync::OnceCell<Checked>>>>,
    key: [u8; 32],
    cell: Arc<tokio::sync::OnceCell<Checked>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Others clone the cell under this lock: the count is stable here
        // (the map's reference and this one are two).
        let last = Arc::strong_count(&self.cell) <= 2;
        if map
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cell))
            && (self.cell.initialized() || last)
        {
            map.remove(&self.key);
        }
    }
}

/// Remembers successful checks for a short time, so an expensive password
/// hash is not recomputed for every request of a session.
pub(crate) struct AuthCache {
    ttl: Duration,
    map: Mutex<HashMap<[u8; 32], (Principal, Instant)>>,
}

const CACHE_MAX: usize = 4096;

impl AuthCache {
    pub(crate) fn new(ttl: Duration) -> AuthCache {
        AuthCache {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn key(realm: Option<&str>, user: &str, password: &str) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        match realm {
            Some(r) => {
                h.update(&[1]);
                h.update(&(r.len() as u64).to_le_bytes());
                h.update(r.as_bytes());
            }
            None => {
                h.update(&[0]);
            }
        }
        h.update(&(user.len() as u64).to_le_bytes());
        h.update(user.as_bytes());
        h.update(password.as_bytes());
        *h.finalize().as_bytes()
    }

    pub(crate) fn get(&self, realm: Option<&str>, user: &str, password: &str) -> Option<Principal> {
        if self.ttl.is_zero() {
            return None;
        }
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&Self::key(realm, user, password)) {
            Some((p, t)) if t.elapsed() < self.ttl => Some(p.clone()),
            _ => None,
        }
    }

    pub(crate) fn put(&self, realm: Option<&str>, user: &str, password: &str, p: &Principal) {
        if self.ttl.is_zero() {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CACHE_MAX {
            let ttl = self.ttl;
            map.retain(|_, (_, t)| t.elapsed() < ttl);
            if map.len() >= CACHE_MAX {
                map.clear();
            }
        }
        map.insert(
            Self::key(realm, user, password),
            (p.clone(), Instant::now()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_header() {
        // "user:pa:ss" — the password may contain ':'.
        assert_eq!(
            parse_basic("Basic dXNlcjpwYTpzcw=="),
            Some(("user".into(), "pa:ss".into()))
        );
        assert_eq!(
            parse_basic("basic dXNlcjpwYTpzcw"),
            Some(("user".into(), "pa:ss".into()))
        );
        assert_eq!(parse_basic("Bearer abc"), None);
        assert_eq!(parse_basic("Basic !!!!"), None);
        assert_eq!(parse_basic("Basic"), None);
        assert_eq!(parse_basic("Basic dXNlcg=="), None); // no ':'
        assert_eq!(base64_decode("TWFu").unwrap(), b"Man");
        assert_eq!(base64_decode("TWE=").unwrap(), b"Ma");
        assert_eq!(base64_decode("TQ==").unwrap(), b"M");
        assert!(base64_decode("T").is_none());
    }

    #[test]
    fn the_same_credentials_at_the_same_time_are_checked_once() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let flight = Arc::new(InFlight::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let client: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let check = |user: &'static str, pass: &'static str, ip: std::net::IpAddr| {
            let (flight, runs) = (flight.clone(), runs.clone());
            rt.spawn(async move {
                flight
                    .check(None, user, pass, ip, || async move {
                        runs.fetch_add(1, SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok(None)
                    })
                    .await
            })
        };
        // Six of the same at once: one check, one outcome for all.
        let same: Vec<_> = (0..6).map(|_| check("u", "p", client)).collect();
        // Another password, or another client: checks of their own.
        let other = [
            check("u", "q", client),
            check("u", "p", "192.0.2.2".parse().unwrap()),
        ];
        for h in same.into_iter().chain(other) {
            assert_eq!(rt.block_on(h).unwrap(), Ok(None));
        }
        assert_eq!(runs.load(SeqCst), 3);
        assert_eq!(flight.len(), 0, "nothing left behind");
        // Once it is over, the same credentials are checked again.
        rt.block_on(check("u", "p", client)).unwrap().unwrap();
        assert_eq!(runs.load(SeqCst), 4);
        // A request that goes away before its check ends (the client
        // hung up) leaves nothing behind.
        rt.block_on(async {
            let slow = flight.check(None, "u", "r", client, || async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(None)
            });
            assert!(tokio::time::timeout(Duration::from_millis(20), slow)
                .await
                .is_err());
        });
        assert_eq!(flight.len(), 0, "an abandoned check left behind");
    }

    #[test]
    fn static_users() {
        let p = Principal {
            name: String::new(),
            uid: 5,
            gid: 6,
            groups: vec![],
            can_write: true,
        };
        let a = StaticUsers::new().with_user("u", "pw", p);
        assert_eq!(a.check("u", "pw").map(|p| p.uid), Some(5));
        assert_eq!(a.check("u", "pw").map(|p| p.name), Some("u".into()));
        assert!(a.check("u", "pw2").is_none());
        assert!(a.check("u", "p").is_none());
        assert!(a.check("v", "pw").is_none());
        assert!(a.anonymous().is_none());
    }
}
