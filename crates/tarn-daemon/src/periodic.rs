//! A daemon thread that does one thing every so often (look at the
//! schedules, sample the history) until the daemon stops or goes away.
//!
//! Between runs it sleeps on a condition variable, not in a polling
//! loop: an idle daemon wakes once per period, and a stop wakes it at
//! once. It holds the pools weakly, so it never keeps a stopping daemon
//! alive; when they are gone it ends. A run that panics is logged and
//! the thread goes on with the next one.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use crate::pools::Pools;

/// The running thread.
pub struct Periodic {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Periodic {
    /// Runs `work` now and then every `every`, on a thread named `name`.
    pub fn start(
        name: &str,
        every: Duration,
        pools: Weak<Pools>,
        work: impl Fn(&Arc<Pools>) + Send + 'static,
    ) -> std::io::Result<Periodic> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || loop {
                match pools.upgrade() {
                    Some(p) => {
                        // A bug in one run must not end the schedules and
                        // alerts for good: it is logged, and the next run
                        // comes as usual.
                        let run =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&p)));
                        if run.is_err() {
                            log::error!(
                                "tarn: a run of the {} thread panicked; it goes on",
                                thread_name()
                            );
                        }
                    }
                    None => return,
                }
                let (lock, cv) = &*flag;
                let stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                let (stopped, _) = cv
                    .wait_timeout_while(stopped, every, |s| !*s)
                    .unwrap_or_else(|e| e.into_inner());
                if *stopped {
                    return;
                }
            })?;
        Ok(Periodic {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread (a run in progress finishes first).
    pub fn stop(&self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn thread_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("periodic")
        .to_string()
}

/// A period from the environment variable `var` in milliseconds (a test
/// hook), at least 10 ms, else `default`.
pub fn tick_from_env(var: &str, default: Duration) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, Duration::from_millis)
        .max(Duration::from_millis(10))
}
