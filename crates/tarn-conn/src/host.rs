//! Hosting a TCP server: its own tokio runtime on its own thread, an
//! accept loop that admits connections through [`Admission`], and a stop
//! that lets connections finish what they have in flight. The block
//! servers (NBD, iSCSI) differ only in what a connection does, so that is
//! all they give: a function run for every admitted connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::{Admission, Conn, Limits, Stats};

/// How long [`Host::stop`] waits for connections to finish.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// TCP keepalive: finds dead peers of connections that never time out.
const KEEPALIVE_TIME: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 6;

/// What to host.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Names the runtime's threads and the admission log lines.
    pub name: &'static str,
    /// Where to listen (port 0: any free port).
    pub bind: SocketAddr,
    /// Most blocking threads (device calls) of the runtime.
    pub workers: usize,
    /// Connection limits.
    pub limits: Limits,
}

/// A hosted server. Dropping it stops it, as [`Host::stop`] does.
pub struct Host {
    addr: SocketAddr,
    admission: Arc<Admission>,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl Host {
    /// Binds the listener, starts the runtime on its own thread, and runs
    /// `serve(stream, peer, conn, stop)` as a task for every admitted
    /// connection; `stop` turns true when the server stops, and the task
    /// should then finish what it has in flight and return. Errors when
    /// the address cannot be bound or the runtime cannot start.
    pub fn start<F, Fut>(cfg: HostConfig, serve: F) -> std::io::Result<Host>
    where
        F: Fn(TcpStream, SocketAddr, Conn, watch::Receiver<bool>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = std::net::TcpListener::bind(cfg.bind)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(cfg.workers.max(1))
            .thread_name(cfg.name)
            .enable_io()
            .enable_time()
            .build()?;
        let admission = Admission::new(cfg.name, cfg.limits);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::io::Result<()>>();
        let adm = admission.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-main", cfg.name))
            .spawn(move || {
                rt.block_on(async move {
                    let l = match TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let accept = tokio::spawn(accept_loop(l, adm.clone(), stop_rx.clone(), serve));
                    let _ = ready_tx.send(Ok(()));
                    let mut stop = stop_rx;
                    let _ = stop.wait_for(|&s| s).await;
                    // Closes the listener; connections see the stop and
                    // finish their requests in flight.
                    accept.abort();
                    let deadline = Instant::now() + STOP_GRACE;
                    while adm.stats().open > 0 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                });
                // Drops what is left (closing its sockets); lets device
                // calls in progress finish.
                rt.shutdown_timeout(Duration::from_secs(2));
            })?;
        let started = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the server thread failed to start")));
        if let Err(e) = started {
            let _ = thread.join();
            return Err(e);
        }
        Ok(Host {
            addr,
            admission,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connection counters: open connections, refusals by reason,
    /// evictions, idle closes.
    pub fn stats(&self) -> Stats {
        self.admission.stats()
    }

    /// Stops the server: closes the listener, lets every connection
    /// finish what it has in flight (up to 10 s), then closes them all.
    /// The port is free when it returns. Must not be called from inside a
    /// tokio runtime's async context (it blocks).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn accept_loop<F, Fut>(
    l: TcpListener,
    adm: Arc<Admission>,
    stop: watch::Receiver<bool>,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, Conn, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let (stream, peer) = match l.accept().await {
            Ok(x) => x,
            Err(_) => {
                // EMFILE and friends: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(conn) = adm.admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        tokio::spawn(serve(stream, peer, conn, stop.clone()));
    }
}

/// Sets TCP keepalive on `s`, so a peer that vanished is found even on a
/// connection without an idle timeout.
pub fn keepalive(s: &TcpStream) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_TIME)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let _ = socket2::SockRef::from(s).set_tcp_keepalive(&ka);
}
