//! A writer that notes when its stream last took bytes: a server gives up
//! a client that takes none of its replies for a while, not one that
//! reads a large reply slowly but steadily (a timeout on the whole write
//! of a batch judged the two alike).

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a write may wait on a client that takes nothing before its
/// connection counts as idle ([`ProgressClock::watch`]).
pub const STALL_IDLE: Duration = Duration::from_secs(10);

/// A writer over `W` that records when `W` last took a byte. Reads (when
/// `W` is a whole connection) pass through untouched.
pub struct Progress<W> {
    inner: W,
    clock: ProgressClock,
}

/// When the stream of a [`Progress`] writer last took a byte, and since
/// when a write has been waiting for it to take one.
#[derive(Clone, Debug)]
pub struct ProgressClock(Arc<Mutex<Marks>>);

#[derive(Debug)]
struct Marks {
    took: Instant,
    waiting: Option<Instant>,
}

impl<W> Progress<W> {
    /// Wraps `inner`; the clock reads its progress.
    pub fn new(inner: W) -> (Progress<W>, ProgressClock) {
        let clock = ProgressClock(Arc::new(Mutex::new(Marks {
            took: Instant::now(),
            waiting: None,
        })));
        (
            Progress {
                inner,
                clock: clock.clone(),
            },
            clock,
        )
    }

    /// The stream, unwrapped.
    pub fn into_inner(self) -> W {
        self.inner
    }

    fn took(&self, r: &Poll<io::Result<usize>>) {
        let mut m = self.clock.marks();
        match r {
            Poll::Pending => {
                m.waiting.get_or_insert_with(Instant::now);
            }
            Poll::Ready(done) => {
                m.waiting = None;
                if done.as_ref().is_ok_and(|n| *n > 0) {
                    m.took = Instant::now();
                }
            }
        }
    }

    fn flushed(&self, r: &Poll<io::Result<()>>) {
        let mut m = self.clock.marks();
        if r.is_pending() {
            m.waiting.get_or_insert_with(Instant::now);
        } else {
            m.waiting = None;
        }
    }
}

impl ProgressClock {
    fn marks(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts from now.
    pub fn reset(&self) {
        self.marks().took = Instant::now();
    }

    /// Time since the stream last took a byte (or since the last reset).
    pub fn idle(&self) -> Duration {
        self.marks().took.elapsed()
    }

    /// How long a write has been waiting without the stream taking a
    /// byte: zero when no write waits. A connection between requests
    /// (nothing to write) is not stalled, however long it stays quiet.
    pub fn stalled(&self) -> Duration {
        let m = self.marks();
        match m.waiting {
            Some(w) => w.max(m.took).elapsed(),
            None => Duration::ZERO,
        }
    }

    /// Watches a connection's writes for as long as it lives: once a
    /// write has waited [`STALL_IDLE`] without its client taking a byte,
    /// `state` counts as idle (it may be evicted for a newcomer, and an
    /// idle timeout applies); resolves when one has waited `close_after`,
    /// for the server to close the connection. A client that stops
    /// reading a download must not hold its slot for ever.
    pub async fn watch(&self, state: &crate::ConnState, close_after: Duration) {
        let tick = (STALL_IDLE / 4).min(close_after / 4);
        loop {
            tokio::time::sleep(tick).await;
            let stalled = self.stalled();
            state.set_stalled(stalled >= STALL_IDLE);
            if stalled >= close_after {
                return;
            }
        }
    }

    /// Runs `write` (to the [`Progress`] writer of this clock) to its end:
    /// true if it succeeded, false if it failed or its stream took no
    /// byte for `timeout` (`None`: no limit).
    pub async fn finish<F: Future<Output = io::Result<()>>>(
        &self,
        write: F,
        timeout: Option<Duration>,
    ) -> bool {
        let Some(t) = timeout else {
            return write.await.is_ok();
        };
        self.reset();
        tokio::pin!(write);
        loop {
            tokio::select! {
                r = &mut write => return r.is_ok(),
                _ = tokio::time::sleep(t / 4) => {
                    if self.idle() >= t {
                        return false;
                    }
                }
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Progress<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.took(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.took(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.flushed(&r);
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<W: AsyncRead + Unpin> AsyncRead for Progress<W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A reader that takes the bytes slowly but steadily outlasts the
    /// timeout many times over and the write succeeds; one that takes
    /// nothing is given up after the timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn progress_not_duration_decides() {
        let (a, mut b) = tokio::io::duplex(4096);
        let (mut w, clock) = Progress::new(a);
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut got = 0usize;
            loop {
                match b.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got += n,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let data = vec![7u8; 512 << 10];
        let t0 = Instant::now();
        let write = async {
            w.write_all(&data).await?;
            w.flush().await
        };
        assert!(clock.finish(write, Some(Duration::from_millis(100))).await);
        assert!(
            t0.elapsed() > Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        drop(w);
        assert_eq!(reader.await.unwrap(), data.len());

        let (a, _b) = tokio::io::duplex(4096);
        let (mut w, clock) = Progress::new(a);
        let t0 = Instant::now();
        let write = async {
            w.write_all(&data).await?;
            w.flush().await
        };
        assert!(!clock.finish(write, Some(Duration::from_millis(100))).await);
        assert!(t0.elapsed() < Duration::from_secs(2));
    }

    /// A quiet connection with nothing to write is not stalled; a write
    /// its peer does not take is, for as long as it waits; once the peer
    /// reads and the write ends, it is not any more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_waiting_write_is_a_stall() {
        let (a, mut b) = tokio::io::duplex(1024);
        let (mut w, clock) = Progress::new(a);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(clock.stalled(), Duration::ZERO, "nothing to write");
        let writing = tokio::spawn(async move {
            w.write_all(&[1u8; 4096]).await.unwrap();
            w.flush().await.unwrap();
            w
        });
        tokio::time::sleep(Duration::from_millis(120)).await;
        let stalled = clock.stalled();
        assert!(stalled >= Duration::from_millis(80), "{stalled:?}");
        let mut got = vec![0u8; 4096];
        b.read_exact(&mut got).await.unwrap();
        let _w = writing.await.unwrap();
        assert_eq!(clock.stalled(), Duration::ZERO, "the write ended");
    }
}
