//! WebDAV locks that end: the library's in-memory lock table with its
//! timeouts enforced.
//!
//! A client that locks a file (Office, Finder) and then sleeps, crashes or
//! loses the network never unlocks it. RFC 4918 gives every lock a
//! timeout for that case; the library records it but never acts on it, so
//! such a file stayed locked (423 for everyone else, and for the same
//! user on another device) until the daemon restarted. This wrapper
//! gives every lock a timeout (a request without one gets
//! [`DEFAULT_TIMEOUT`], never "infinite") and treats an expired lock as
//! gone: it is removed when a lock, check, refresh or discovery meets it.
//! A client that keeps a document open refreshes its lock well before
//! then (every few minutes), as clients do.

use std::time::{Duration, SystemTime};

use dav_server::davpath::DavPath;
use dav_server::ls::{DavLock, DavLockSystem, LsFuture};
use xmltree::Element;

/// The timeout of a lock whose request asked for none (or for a refresh
/// without one).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Expired locks a single call removes at most before it gives up (a
/// bound on work, not a limit anyone meets).
const MAX_SWEEP: usize = 10_000;

/// A lock table whose locks expire (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ExpiringLs {
    inner: Box<dyn DavLockSystem>,
}

impl ExpiringLs {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Box<dyn DavLockSystem>) -> Box<ExpiringLs> {
        Box::new(ExpiringLs { inner })
    }
}

fn expired(l: &DavLock, now: SystemTime) -> bool {
    l.timeout_at.is_some_and(|t| t <= now)
}

impl ExpiringLs {
    /// Runs `attempt` (a lock or a check) until the lock in its way, if
    /// any, is one that has not expired: an expired one is removed and
    /// the attempt made again.
    async fn sweeping<'a, T>(
        &'a self,
        attempt: impl Fn() -> LsFuture<'a, Result<T, DavLock>>,
    ) -> Result<T, DavLock> {
        let mut swept = 0;
        loop {
            match attempt().await {
                Err(other) if swept < MAX_SWEEP && expired(&other, SystemTime::now()) => {
                    swept += 1;
                    let _ = self.inner.unlock(&other.path, &other.token).await;
                }
                r => return r,
            }
        }
    }
}

impl DavLockSystem for ExpiringLs {
    fn lock(
        &'_ self,
        path: &DavPath,
        principal: Option<&str>,
        owner: Option<&Element>,
        timeout: Option<Duration>,
        shared: bool,
        deep: bool,
    ) -> LsFuture<'_, Result<DavLock, DavLock>> {
        let (path, principal, owner) =
            (path.clone(), principal.map(str::to_string), owner.cloned());
        Box::pin(async move {
            let timeout = Some(timeout.unwrap_or(DEFAULT_TIMEOUT));
            self.sweeping(|| {
                self.inner.lock(
                    &path,
                    principal.as_deref(),
                    owner.as_ref(),
                    timeout,
                    shared,
                    deep,
                )
            })
            .await
        })
    }

    fn unlock(&'_ self, path: &DavPath, token: &str) -> LsFuture<'_, Result<(), ()>> {
        self.inner.unlock(path, token)
    }

    fn refresh(
        &'_ self,
        path: &DavPath,
        token: &str,
        timeout: Option<Duration>,
    ) -> LsFuture<'_, Result<DavLock, ()>> {
        let (path, token) = (path.clone(), token.to_string());
        Box::pin(async move {
            // An expired lock is gone: it cannot be brought back.
            let now = SystemTime::now();
            let held = self.inner.discover(&path).await;
            if let Some(l) = held.iter().find(|l| l.token == token && expired(l, now)) {
                let _ = self.inner.unlock(&l.path, &l.token).await;
                return Err(());
            }
            let timeout = Some(timeout.unwrap_or(DEFAULT_TIMEOUT));
            self.inner.refresh(&path, &token, timeout).await
        })
    }

    fn check(
        &'_ self,
        path: &DavPath,
        principal: Option<&str>,
        ignore_principal: bool,
        deep: bool,
        submitted_tokens: &[String],
    ) -> LsFuture<'_, Result<(), DavLock>> {
        let (path, principal, tokens) = (
            path.clone(),
            principal.map(str::to_string),
            submitted_tokens.to_vec(),
        );
        Box::pin(async move {
            self.sweeping(|| {
                self.inner
                    .check(&path, principal.as_deref(), ignore_principal, deep, &tokens)
            })
            .await
        })
    }

    fn discover(&'_ self, path: &DavPath) -> LsFuture<'_, Vec<DavLock>> {
        let path = path.clone();
        Box::pin(async move {
            let now = SystemTime::now();
            let (gone, live): (Vec<DavLock>, Vec<DavLock>) = self
                .inner
                .discover(&path)
                .await
                .into_iter()
                .partition(|l| expired(l, now));
            for l in gone {
                let _ = self.inner.unlock(&l.path, &l.token).await;
            }
            live
        })
    }

    fn delete(&'_ self, path: &DavPath) -> LsFuture<'_, Result<(), ()>> {
        self.inner.delete(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dav_server::memls::MemLs;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// Alice's exclusive, shallow lock of `p` for `ms` milliseconds.
    async fn alices(ls: &ExpiringLs, p: &DavPath, ms: u64) -> DavLock {
        ls.lock(
            p,
            Some("alice"),
            None,
            Some(Duration::from_millis(ms)),
            false,
            false,
        )
        .await
        .unwrap()
    }

    #[test]
    fn locks_end_at_their_timeout() {
        let ls = ExpiringLs::new(MemLs::new());
        let p = DavPath::new("/doc.txt").unwrap();
        block_on(async {
            // A lock without a timeout gets one.
            let l = ls
                .lock(&p, Some("alice"), None, None, false, false)
                .await
                .unwrap();
            assert_eq!(l.timeout, Some(DEFAULT_TIMEOUT));
            ls.unlock(&p, &l.token).await.unwrap();
            // A short one: held, then gone for everyone.
            let l = alices(&ls, &p, 50).await;
            assert!(ls.check(&p, Some("bob"), false, false, &[]).await.is_err());
            assert!(ls
                .lock(&p, Some("bob"), None, None, false, false)
                .await
                .is_err());
            std::thread::sleep(Duration::from_millis(80));
            assert!(
                ls.discover(&p).await.is_empty(),
                "expired locks are not shown"
            );
            assert!(ls.check(&p, Some("bob"), false, false, &[]).await.is_ok());
            assert!(
                ls.refresh(&p, &l.token, None).await.is_err(),
                "nor refreshed"
            );
            let b = ls.lock(&p, Some("bob"), None, None, false, false).await;
            assert!(b.is_ok(), "bob locks it now");
        });
    }

    #[test]
    fn an_expired_lock_below_does_not_hold_a_deep_lock_up() {
        let ls = ExpiringLs::new(MemLs::new());
        let dir = DavPath::new("/dir/").unwrap();
        let file = DavPath::new("/dir/f.txt").unwrap();
        block_on(async {
            alices(&ls, &file, 30).await;
            std::thread::sleep(Duration::from_millis(60));
            assert!(ls
                .lock(&dir, Some("bob"), None, None, false, true)
                .await
                .is_ok());
        });
    }
}
