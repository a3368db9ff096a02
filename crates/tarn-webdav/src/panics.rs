//! Panics inside request handling: caught per request, answered 500 and
//! logged in one rate-limited line, never a backtrace per request.
//!
//! A process-wide panic hook is installed once (chained to the one
//! before it). It stays silent only on a thread that is inside
//! [`quietly`] — polling a request, running one of its filesystem calls
//! — and there records where the panic happened, for the log line the
//! catcher prints. Panics anywhere else reach the previous hook as
//! before.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{AssertUnwindSafe, UnwindSafe};
use std::pin::Pin;
use std::sync::{Once, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tarn_conn::RateLog;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static WHERE: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn log() -> &'static RateLog {
    static LOG: OnceLock<RateLog> = OnceLock::new();
    LOG.get_or_init(|| RateLog::new("tarn-webdav", Duration::from_secs(10)))
}

/// Installs the hook (once per process).
pub(crate) fn install_hook() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                WHERE.with(|w| *w.borrow_mut() = Some(at));
            } else {
                prev(info);
            }
        }));
    });
}

/// Runs `f` with this thread's panics quiet.
pub(crate) fn quietly<R>(f: impl FnOnce() -> R) -> R {
    let before = QUIET.with(|q| q.replace(true));
    let r = f();
    QUIET.with(|q| q.set(before));
    r
}

fn message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Logs a caught panic: one line, at most one every 10 s (the next line
/// says how many were left out).
pub(crate) fn report(what: &str, payload: &(dyn std::any::Any + Send)) {
    let at = WHERE.with(|w| w.borrow_mut().take()).unwrap_or_default();
    let mut msg = message(payload);
    msg.truncate(300);
    log().log(
        "panic",
        &format!("caught a panic in {what}: {msg:?} at {at}"),
    );
}

/// Runs `f` quietly and catches its panic (logged by [`report`]).
pub(crate) fn catch<R>(what: &str, f: impl FnOnce() -> R + UnwindSafe) -> Option<R> {
    match quietly(|| std::panic::catch_unwind(f)) {
        Ok(r) => Some(r),
        Err(p) => {
            report(what, p.as_ref());
            None
        }
    }
}

/// A future polled quietly, whose panic becomes `Err(payload)`.
pub(crate) struct Caught<F>(pub F);

impl<F: Future + Unpin> Future for Caught<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match quietly(|| std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx)))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(p) => Poll::Ready(Err(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caught_panics_are_quiet_and_reported() {
        install_hook();
        assert_eq!(catch("test", || 5), Some(5));
        assert_eq!(catch("test", || -> u8 { panic!("boom") }), None);
        assert!(!QUIET.with(Cell::get), "quiet flag restored");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt.block_on(Caught(Box::pin(async { panic!("in a future") })));
        let p: Result<(), _> = r;
        assert_eq!(message(p.unwrap_err().as_ref()), "in a future");
    }
}
