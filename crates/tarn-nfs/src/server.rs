//! Listeners, connections and the worker pool (see the crate docs).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use std::io::IoSlice;

use bytes::BufMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

use tarn_conn::{Admission, Busy, Conn, ConnState, Limits};

use crate::export::Export;
use crate::record::{self, Decoder};
use crate::service::{build_entries, Reply, Service};
use crate::Error;

/// Server configuration: addresses and bounds.
#[derive(Clone, Debug)]
pub struct NfsConfig {
    /// Address of the NFS service (port 0: any free port). It also answers
    /// MOUNT and portmapper GETPORT calls.
    pub bind: SocketAddr,
    /// Address of a separate MOUNT listener; None: MOUNT only on `bind`.
    pub mount_bind: Option<SocketAddr>,
    /// Largest request record accepted; a larger record header closes the
    /// connection. Default 1 MiB + 64 KiB.
    pub max_record: usize,
    /// Largest READ/WRITE payload and READDIR reply (FSINFO rtmax/wtmax).
    /// Default 1 MiB.
    pub max_io: u32,
    /// Most simultaneous connections. When all are taken, an idle
    /// connection is closed for a newcomer (one of the address holding the
    /// most connections, the longest idle of those); only when every one
    /// is busy is the newcomer closed at accept. Default 256.
    pub max_connections: usize,
    /// Most simultaneous connections from one client address; more from
    /// that address are closed at accept. Default 32 (Linux's `nconnect`
    /// uses at most 16 per server).
    pub max_connections_per_address: usize,
    /// A connection with no request in progress for this long is closed
    /// (a client reconnects transparently). Partial requests do not count
    /// as activity. `Duration::ZERO`: never. Default 6 minutes, as Linux's
    /// nfsd. Also the time a reply may take to be written before the
    /// connection is given up.
    pub idle_timeout: Duration,
    /// Most requests of one connection being processed at once; the
    /// connection is not read further until one finishes.
    pub max_inflight_per_connection: usize,
    /// Threads running filesystem calls (blocking work).
    pub workers: usize,
    /// Key for the handles' integrity check. Keep it stable (e.g. stored
    /// in the pool) so handles survive restarts.
    pub handle_key: [u8; 32],
}

impl Default for NfsConfig {
    fn default() -> Self {
        NfsConfig {
            bind: SocketAddr::from(([0, 0, 0, 0], 2049)),
            mount_bind: None,
            max_record: (1 << 20) + (64 << 10),
            max_io: 1 << 20,
            max_connections: 256,
            max_connections_per_address: 32,
            idle_timeout: Duration::from_secs(6 * 60),
            max_inflight_per_connection: 16,
            workers: 8,
            handle_key: *b"tarn-nfs default handle key v1\0\0",
        }
    }
}

/// Connection counters of a running server (see [`Running::stats`]).
pub use tarn_conn::Stats as ConnStats;

/// The NFS server (see [`NfsServer::start`]).
pub struct NfsServer;

impl NfsServer {
    /// Binds the listeners, starts the runtime and worker pool on their
    /// own threads, and returns a handle. Exports can be changed later
    /// with [`Running::set_exports`].
    pub fn start(config: NfsConfig, exports: Vec<Export>) -> Result<Running, Error> {
        if config.max_record < 4096
            || config.max_io == 0
            || config.max_io as usize > config.max_record
        {
            return Err(Error::Config(
                "max_io must be in 1..=max_record, max_record >= 4096".into(),
            ));
        }
        let entries = build_entries(exports)?;
        let nfs_std = bind(config.bind)?;
        let mount_std = config.mount_bind.map(bind).transpose()?;
        let nfs_addr = nfs_std.local_addr()?;
        let mount_addr = match &mount_std {
            Some(l) => l.local_addr()?,
            None => nfs_addr,
        };
        let svc = Arc::new(Service {
            exports: RwLock::new(Arc::new(entries)),
            handle_key: config.handle_key,
            write_verf: new_verifier(),
            max_io: config.max_io,
            nfs_port: nfs_addr.port(),
            mount_port: mount_addr.port(),
            mounts: Mutex::new(Vec::new()),
            stats: crate::service::new_stats(),
            drc: Default::default(),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(config.workers.max(1))
            .thread_name("tarn-nfs")
            .enable_io()
            .enable_time()
            .build()?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), Error>>();
        let admission = Admission::new(
            "tarn-nfs",
            Limits {
                max_connections: config.max_connections,
                max_per_address: config.max_connections_per_address,
            },
        );
        let svc2 = svc.clone();
        let adm2 = admission.clone();
        let thread = std::thread::Builder::new()
            .name("tarn-nfs-main".into())
            .spawn(move || {
                let ready_err = ready_tx.clone();
                let r = rt.block_on(async move {
                    let mut listeners = vec![TcpListener::from_std(nfs_std)?];
                    if let Some(m) = mount_std {
                        listeners.push(TcpListener::from_std(m)?);
                    }
                    for l in listeners {
                        tokio::spawn(accept_loop(l, svc2.clone(), adm2.clone(), config.clone()));
                    }
                    let _ = ready_tx.send(Ok(()));
                    let _ = stop_rx.await;
                    Ok::<(), Error>(())
                });
                if let Err(e) = r {
                    let _ = ready_err.send(Err(e));
                }
                // Drops every task (closing every socket); lets running
                // filesystem calls finish.
                rt.shutdown_timeout(Duration::from_secs(10));
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::Config("server thread failed to start".into()));
            }
        }
        Ok(Running {
            svc,
            admission,
            nfs_addr,
            mount_addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

/// A running server. Dropping it stops it, as [`Running::stop`] does.
pub struct Running {
    svc: Arc<Service>,
    admission: Arc<Admission>,
    nfs_addr: SocketAddr,
    mount_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    /// The bound addresses: (NFS, MOUNT). Equal when MOUNT shares the NFS
    /// listener.
    pub fn local_addrs(&self) -> (SocketAddr, SocketAddr) {
        (self.nfs_addr, self.mount_addr)
    }

    /// Replaces the export list. Connections stay open; the next call on
    /// each uses the new list (a handle of a removed export turns STALE, a
    /// client no longer allowed gets ACCES).
    pub fn set_exports(&self, exports: Vec<Export>) -> Result<(), Error> {
        let entries = Arc::new(build_entries(exports)?);
        match self.svc.exports.write() {
            Ok(mut g) => *g = entries,
            Err(p) => *p.into_inner() = entries,
        }
        Ok(())
    }

    /// Connection counters: open connections, refusals by reason,
    /// evictions, idle closes.
    pub fn stats(&self) -> ConnStats {
        self.admission.stats()
    }

    /// Requests per NFS procedure since the start: (name, latency
    /// histogram, errors), for the metrics endpoint.
    pub fn request_stats(&self) -> Vec<(&'static str, tarn_stats::Snapshot, u64)> {
        crate::service::PROC_NAMES
            .iter()
            .zip(&self.svc.stats)
            .map(|(name, s)| {
                (
                    *name,
                    s.latency.snapshot(),
                    s.errors.load(std::sync::atomic::Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// The write verifier WRITE and COMMIT answer for files of `fs`: it
    /// changes at each start of the server and each opening of the
    /// filesystem.
    pub fn write_verifier(&self, fs: &dyn crate::ExportFs) -> [u8; 8] {
        self.svc.verifier(fs)
    }

    /// Stops the server: closes the listeners and every connection, waits
    /// (up to 10 s) for filesystem calls in progress. The ports are free
    /// when it returns. Must not be called from inside a tokio runtime's
    /// async context (it blocks).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, Error> {
    // The standard library sets SO_REUSEADDR on Unix, so rebinding right
    // after a stop works despite connections in TIME_WAIT.
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// A write verifier that differs on every start: the standard library's
/// randomly seeded hasher keys, mixed with the clock and process id.
fn new_verifier() -> [u8; 8] {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    h.finish().to_be_bytes()
}

async fn accept_loop(l: TcpListener, svc: Arc<Service>, adm: Arc<Admission>, cfg: NfsConfig) {
    loop {
        let (stream, peer) = match l.accept().await {
            Ok(x) => x,
            Err(_) => {
                // EMFILE and friends: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // An address no export lists gets nothing, not even a slot: it
        // can neither use a share nor crowd out those who may.
        if !svc.any_export_allows(peer.ip()) {
            adm.refuse_unlisted(peer.ip(), "no export lists this client");
            drop(stream);
            continue;
        }
        let Ok(conn) = adm.admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        let svc = svc.clone();
        let cfg = cfg.clone();
        tokio::spawn(async move {
            connection(stream, conn, svc, &cfg).await;
        });
    }
}

/// Most replies gathered into one vectored write.
const REPLY_BATCH: usize = 32;
/// Fragment bytes still to come from which the reader reads straight into
/// the record instead of through its buffer.
const DIRECT_READ_MIN: usize = 16 << 10;

/// Serves one connection: the reader decodes records and hands each to a
/// worker (at most `max_inflight_per_connection` at once); replies go
/// back through a channel to the writer task in completion order. Each
/// request holds a [`Busy`] guard from its decoding until its reply is
/// written, so a connection with requests in flight is never idle.
async fn connection(stream: TcpStream, conn: Conn, svc: Arc<Service>, cfg: &NfsConfig) {
    let peer = conn.ip();
    let idle = (!cfg.idle_timeout.is_zero()).then_some(cfg.idle_timeout);
    let _ = stream.set_nodelay(true);
    let (mut rd, wr) = stream.into_split();
    let inflight = cfg.max_inflight_per_connection.max(1);
    let (tx, rx) = mpsc::channel::<(Reply, Busy)>(inflight);
    let writer = tokio::spawn(write_replies(wr, rx, conn.state().clone(), idle));
    let slots = Arc::new(Semaphore::new(inflight));
    let mut dec = Decoder::new(cfg.max_record);
    let mut buf = vec![0u8; 64 * 1024];
    let mut records = Vec::new();
    'conn: loop {
        let got = tokio::select! {
            r = read_records(&mut rd, &mut dec, &mut buf, &mut records) => r,
            // Evicted for a newcomer, idle too long, or the writer gave up.
            _ = conn.closed(idle) => break,
        };
        if !got {
            // End of stream, a socket error, or a record over the bound:
            // this connection only is closed.
            break;
        }
        for rec in records.drain(..) {
            let busy = conn.state().begin();
            let Ok(permit) = slots.clone().acquire_owned().await else {
                break 'conn;
            };
            let svc = svc.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let reply = tokio::task::spawn_blocking(move || svc.dispatch(peer, &rec)).await;
                if let Ok(Some(reply)) = reply {
                    let _ = tx.send((reply, busy)).await;
                }
                drop(permit);
            });
        }
    }
    drop(tx);
    // Let requests already taken finish and their replies go out.
    let _ = writer.await;
    drop(conn);
}

/// Reads once from the socket and decodes what came: into the record
/// itself when a large fragment is under way (no copy through `buf`),
/// else into `buf`. False at end of stream, on an error, or when a record
/// is over the bound.
async fn read_records(
    rd: &mut OwnedReadHalf,
    dec: &mut Decoder,
    buf: &mut [u8],
    records: &mut Vec<Vec<u8>>,
) -> bool {
    if let Some((rec, left)) = dec.body_room(DIRECT_READ_MIN) {
        // `record` has room for the whole fragment (reserved at its
        // header), so this read appends without reallocating.
        let mut room = rec.limit(left);
        return match rd.read_buf(&mut room).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                dec.filled(n, records);
                true
            }
        };
    }
    match rd.read(buf).await {
        Ok(0) | Err(_) => false,
        Ok(n) => dec.feed(&buf[..n], records).is_ok(),
    }
}

/// Writes replies as they come, several at once when they queue up: their
/// record headers, bodies and READ data (as ranges of cached blocks) go
/// out in one vectored write, copied by nobody but the kernel. A client
/// that takes none of its replies for 10 s counts as idle (it may be
/// evicted for a newcomer), and one that takes none for `idle` is given
/// up; one that reads slowly but steadily is not.
async fn write_replies(
    wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<(Reply, Busy)>,
    state: Arc<ConnState>,
    idle: Option<Duration>,
) {
    let (mut wr, clock) = tarn_conn::Progress::new(wr);
    let mut batch: Vec<(Reply, Busy)> = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < REPLY_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let heads: Vec<[u8; 4]> = batch.iter().map(|(r, _)| record::header(r.len())).collect();
        let mut slices: Vec<IoSlice> = Vec::with_capacity(batch.len() * 3);
        for ((reply, _), head) in batch.iter().zip(&heads) {
            slices.push(IoSlice::new(head));
            slices.push(IoSlice::new(&reply.body));
            if let Some(data) = &reply.data {
                slices.extend(data.slices().map(IoSlice::new));
                slices.push(IoSlice::new(&[0u8; 3][..reply.pad()]));
            }
        }
        let write = write_all_vectored(&mut wr, &mut slices);
        let ok = tokio::select! {
            r = write => r.is_ok(),
            _ = clock.watch(&state, idle.unwrap_or(Duration::MAX)) => false,
        };
        state.set_stalled(false);
        drop(slices);
        // The requests are done once their replies are written.
        batch.clear();
        if !ok {
            state.close();
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// Writes every byte of `slices` (which it consumes), in as few system
/// calls as the socket allows.
async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    wr: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = wr.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}
