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

use tokio::io::AsyncWrite;

/// A writer over `W` that records when `W` last took a byte.
pub struct Progress<W> {
    inner: W,
    clock: ProgressClock,
}

/// When the stream of a [`Progress`] writer last took a byte.
#[derive(Clone, Debug)]
pub struct ProgressClock(Arc<Mutex<Instant>>);

impl<W> Progress<W> {
    /// Wraps `inner`; the clock reads its progress.
    pub fn new(inner: W) -> (Progress<W>, ProgressClock) {
        let clock = ProgressClock(Arc::new(Mutex::new(Instant::now())));
        (
            Progress {
                inner,
                clock: clock.clone(),
            },
            clock,
        )
    }

    fn took(&self, r: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = r {
            if *n > 0 {
                self.clock.reset();
            }
        }
    }
}

impl ProgressClock {
    /// Counts from now.
    pub fn reset(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Time since the stream last took a byte (or since the last reset).
    pub fn idle(&self) -> Duration {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).elapsed()
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
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
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
}
